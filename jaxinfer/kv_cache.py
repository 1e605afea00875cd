"""Contiguous KV cache: one preallocated buffer per layer, written by returning a new cache.

Every cache type offers `write(layer, k, v, positions)`; attention reads it through
`attention.attend`. Positions past the cache's capacity are dropped, never wrapped. Rolling
back (speculative decoding) is a length reset by the caller: entries beyond a sequence's length
are hidden by the causal mask and overwritten by the next write.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Keys and values per layer, sequence slot and position."""

    k: list[jax.Array]  # L x [B, KV, S, K]
    v: list[jax.Array]  # L x [B, KV, K, S]

    @property
    def max_seq_len(self) -> int:
        """Positions each sequence slot can hold."""
        return self.k[0].shape[2]

    def write(self, layer: int, k: jax.Array, v: jax.Array, positions: jax.Array) -> "KVCache":
        """Store k/v [B, T, KV, K] of `layer` at positions [B, T]; out-of-range positions are dropped."""
        batch = jnp.arange(k.shape[0])[:, None]
        new_k, new_v = list(self.k), list(self.v)
        # Mixed indexing puts the indexed axes first, so the target region is [B, T, KV, K] like k.
        new_k[layer] = self.k[layer].at[batch, :, positions].set(k.astype(self.k[layer].dtype), mode="drop")
        new_v[layer] = self.v[layer].at[batch, :, :, positions].set(v.astype(self.v[layer].dtype), mode="drop")
        return KVCache(new_k, new_v)


def init_cache(cfg: ModelConfig, batch: int, max_seq_len: int, dtype: jnp.dtype) -> KVCache:
    """A zeroed cache (zeros, not empty: uninitialised memory must never reach attention).

    Both attention products contract the minor axis of the cache block they read (keys
    [S, K] over K, values [K, S] over S): with positions first XLA transposed the whole
    layer's cache at every decode step, and a values block contracted over its major axis
    left the fast dot path on CPU.
    """
    k_shape = (batch, cfg.num_kv_heads, max_seq_len, cfg.head_dim)
    v_shape = (batch, cfg.num_kv_heads, cfg.head_dim, max_seq_len)
    zeros = lambda shape: [jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)]  # noqa: E731
    return KVCache(zeros(k_shape), zeros(v_shape))


def cache_bytes(cache: object) -> int:
    """Bytes a cache pytree holds on device (page tables included)."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
