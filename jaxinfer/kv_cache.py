"""Contiguous KV cache: one preallocated pytree, written by returning a new one.

Positions past `max_seq_len` are dropped, never wrapped. Rolling back (speculative decoding)
is a length reset by the caller: entries beyond a sequence's length are masked by the causal
mask and overwritten on the next write.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Keys and values for every layer, sequence slot and position."""

    k: jax.Array  # [L, B, S, KV, K]
    v: jax.Array  # [L, B, S, KV, K]

    @property
    def max_seq_len(self) -> int:
        """Positions each sequence slot can hold."""
        return self.k.shape[2]

    def write(self, layer: int, k: jax.Array, v: jax.Array, positions: jax.Array) -> "KVCache":
        """Store k/v [B, T, KV, K] of `layer` at positions [B, T]; out-of-range positions are dropped."""
        batch = jnp.arange(k.shape[0])[:, None]
        new_k = self.k.at[layer, batch, positions].set(k.astype(self.k.dtype), mode="drop")
        new_v = self.v.at[layer, batch, positions].set(v.astype(self.v.dtype), mode="drop")
        return KVCache(new_k, new_v)

    def layer_kv(self, layer: int) -> tuple[jax.Array, jax.Array]:
        """Keys and values [B, S, KV, K] of one layer."""
        return self.k[layer], self.v[layer]


def init_cache(cfg: ModelConfig, batch: int, max_seq_len: int, dtype: jnp.dtype) -> KVCache:
    """A zeroed cache (zeros, not empty: uninitialised memory must never reach attention)."""
    shape = (cfg.num_layers, batch, max_seq_len, cfg.num_kv_heads, cfg.head_dim)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def cache_bytes(cfg: ModelConfig, batch: int, max_seq_len: int, dtype: jnp.dtype) -> int:
    """Bytes a cache of this size takes on device."""
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(dtype).itemsize
    return per_token * batch * max_seq_len
