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
from jaxinfer.cpu_kernels import write_positions
from jaxinfer.sharding import UNSHARDED, Layout

K_AXES = ("batch", "kv_heads", None, "head_dim")  # [B, KV, S, K]
V_AXES = ("batch", "kv_heads", "head_dim", None)  # [B, KV, K, S]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Keys and values per layer, sequence slot and position."""

    k: list[jax.Array]  # L x [B, KV, S, K]
    v: list[jax.Array]  # L x [B, KV, K, S]
    # Static: writes and few-query attention use the native CPU kernels (part of the jit key).
    cpu_kernels: bool = dataclasses.field(default=False, metadata={"static": True})
    # Static: the mesh and rules the buffers (and the model's activations) are laid out by.
    layout: Layout = dataclasses.field(default=UNSHARDED, metadata={"static": True})

    @property
    def max_seq_len(self) -> int:
        """Positions each sequence slot can hold."""
        return self.k[0].shape[2]

    def write(self, layer: int, k: jax.Array, v: jax.Array, positions: jax.Array) -> "KVCache":
        """Store k/v [B, T, KV, K] of `layer` at positions [B, T]; positions outside the cache are dropped."""
        store = write_positions if self.cpu_kernels else scatter_positions
        new_k, new_v = list(self.k), list(self.v)
        new_k[layer] = self.layout.constrain(store(self.k[layer], k, positions, transposed=False), K_AXES)
        new_v[layer] = self.layout.constrain(store(self.v[layer], v, positions, transposed=True), V_AXES)
        return dataclasses.replace(self, k=new_k, v=new_v)


def scatter_positions(cache: jax.Array, updates: jax.Array, positions: jax.Array, transposed: bool) -> jax.Array:
    """XLA's scatter with the contract of `cpu_kernels.write_positions` (used off CPU).

    cache [B, KV, S, K] (or [B, KV, K, S] if transposed), updates [B, T, KV, K], positions [B, T].
    """
    batch = jnp.arange(updates.shape[0])[:, None]
    seq = cache.shape[3] if transposed else cache.shape[2]
    positions = jnp.where(positions < 0, seq, positions)  # dropped, not wrapped like a Python index
    updates = updates.astype(cache.dtype)
    # Mixed indexing puts the indexed axes first, so the target region is [B, T, KV, K] like updates.
    if transposed:
        return cache.at[batch, :, :, positions].set(updates, mode="drop")
    return cache.at[batch, :, positions].set(updates, mode="drop")


def init_cache(
    cfg: ModelConfig, batch: int, max_seq_len: int, dtype: jnp.dtype, cpu_kernels: bool = False,
    layout: Layout = UNSHARDED,
) -> KVCache:
    """A zeroed cache (zeros, not empty: uninitialised memory must never reach attention).

    Both attention products contract the minor axis of the cache block they read (keys
    [S, K] over K, values [K, S] over S): with positions first XLA transposed the whole
    layer's cache at every decode step, and a values block contracted over its major axis
    left the fast dot path on CPU. On a mesh the batch splits over dp and kv heads over tp
    (kept whole on every device when tp does not divide them).
    """
    k_shape = (batch, cfg.num_kv_heads, max_seq_len, cfg.head_dim)
    v_shape = (batch, cfg.num_kv_heads, cfg.head_dim, max_seq_len)
    k = [layout.zeros(k_shape, dtype, K_AXES) for _ in range(cfg.num_layers)]
    v = [layout.zeros(v_shape, dtype, V_AXES) for _ in range(cfg.num_layers)]
    return KVCache(k, v, cpu_kernels, layout)


def cache_bytes(cache: object) -> int:
    """Bytes a cache pytree holds on device (page tables included)."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
