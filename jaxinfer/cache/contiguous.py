"""Contiguous KV cache: one preallocated buffer per layer, written by returning a new cache.

Every cache type offers `write(layer, k, v, positions)`; attention reads it through
`attention.attend`. Positions past the cache's capacity are dropped, never wrapped. Rolling
back (speculative decoding) is a length reset by the caller: entries beyond a sequence's length
are hidden by the causal mask and overwritten by the next write. With `kv_dtype="fp8"` the
buffers hold float8_e4m3fn values and each (sequence, head, position) a float32 scale.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.cache import per_layer
from jaxinfer.config.model import ModelConfig
from jaxinfer.kernels.cpu import write_positions
from jaxinfer.parallel.sharding import UNSHARDED, Layout
from pallas_kernels import quantize_kv_fp8

K_AXES = ("batch", "kv_heads", None, "head_dim")  # [B, KV, S, K]
V_AXES = ("batch", "kv_heads", "head_dim", None)  # [B, KV, K, S]
SCALE_AXES = ("batch", "kv_heads", None, None)  # [B, KV, S, 1]
CONTIGUOUS_KV_DTYPES = ("auto", "fp8")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Keys and values per layer, sequence slot and position."""

    k: list[jax.Array]  # L x [B, KV, S, K]
    v: list[jax.Array]  # L x [B, KV, K, S]
    k_scales: list[jax.Array] | None = None  # L x [B, KV, S, 1] float32 (fp8 storage only)
    v_scales: list[jax.Array] | None = None  # L x [B, KV, S, 1]
    # Static: writes and few-query attention use the native CPU kernels (part of the jit key).
    cpu_kernels: bool = dataclasses.field(default=False, metadata={"static": True})
    # Static: the mesh and rules the buffers (and the model's activations) are laid out by.
    layout: Layout = dataclasses.field(default=UNSHARDED, metadata={"static": True})

    @property
    def max_seq_len(self) -> int:
        """Positions each sequence slot can hold."""
        return self.k[0].shape[2]

    @property
    def quantized(self) -> bool:
        """True when the buffers hold fp8 values with per-token-per-head scales."""
        return self.k_scales is not None

    def write(self, layer: int, k: jax.Array, v: jax.Array, positions: jax.Array) -> "KVCache":
        """Store k/v [B, T, KV, K] of `layer` at positions [B, T]; positions outside the cache are dropped."""
        store = write_positions if self.cpu_kernels else scatter_positions
        if self.quantized:
            (k, k_scale), (v, v_scale) = quantize_kv_fp8(k), quantize_kv_fp8(v)  # scales [B, T, KV]
        new_k, new_v = list(self.k), list(self.v)
        new_k[layer] = self.layout.constrain(store(self.k[layer], k, positions, transposed=False), K_AXES)
        new_v[layer] = self.layout.constrain(store(self.v[layer], v, positions, transposed=True), V_AXES)
        if not self.quantized:
            return dataclasses.replace(self, k=new_k, v=new_v)
        k_scales, v_scales = list(self.k_scales), list(self.v_scales)
        k_scales[layer] = store(self.k_scales[layer], k_scale[..., None], positions, transposed=False)
        v_scales[layer] = store(self.v_scales[layer], v_scale[..., None], positions, transposed=False)
        k_scales[layer] = self.layout.constrain(k_scales[layer], SCALE_AXES)
        v_scales[layer] = self.layout.constrain(v_scales[layer], SCALE_AXES)
        return dataclasses.replace(self, k=new_k, v=new_v, k_scales=k_scales, v_scales=v_scales)

    def layer_view(self, layer: int) -> "KVCache":
        """These buffers of `layer` alone, as layer 0 (see models.layer_calls)."""
        return per_layer.layer_view(self, LAYERED, layer)

    def with_layer(self, layer: int, view: "KVCache") -> "KVCache":
        """This cache with `layer`'s buffers taken from a one-layer view."""
        return per_layer.with_layer(self, LAYERED, layer, view)


LAYERED = ("k", "v", "k_scales", "v_scales")  # the fields holding one buffer per layer


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
    kv_dtype: str = "auto",
) -> KVCache:
    """A zeroed cache (zeros, not empty: uninitialised memory must never reach attention).

    Both attention products contract the minor axis of the cache block they read (keys
    [S, K] over K, values [K, S] over S): with positions first XLA transposed the whole
    layer's cache at every decode step, and a values block contracted over its major axis
    left the fast dot path on CPU. On a mesh the batch splits over dp and kv heads over tp
    (kept whole on every device when tp does not divide them).
    """
    if kv_dtype not in CONTIGUOUS_KV_DTYPES:
        raise ValueError(f"kv_dtype {kv_dtype!r} is not one of {', '.join(CONTIGUOUS_KV_DTYPES)} (contiguous cache)")
    fp8 = kv_dtype == "fp8"
    store = jnp.float8_e4m3fn if fp8 else dtype

    def zeros(part: str, dt: jnp.dtype, axes: tuple) -> list[jax.Array]:
        # Each layer's own kv heads and head dim; a Gemma 4 layer reading another's K/V holds none (width 0).
        buffers = []
        for i in range(cfg.num_layers):
            heads, head_dim = cfg.kv_shape(i)
            head_dim = head_dim if cfg.kv_source(i) == i else 0
            shape = {"k": (batch, heads, max_seq_len, head_dim), "v": (batch, heads, head_dim, max_seq_len),
                     "scale": (batch, heads, max_seq_len, 1)}[part]
            buffers.append(layout.zeros(shape, dt, axes if head_dim else (None,) * 4))
        return buffers

    scales = lambda: zeros("scale", jnp.float32, SCALE_AXES) if fp8 else None  # noqa: E731
    return KVCache(
        zeros("k", store, K_AXES), zeros("v", store, V_AXES), scales(), scales(), cpu_kernels=cpu_kernels,
        layout=layout,
    )


def cache_bytes(cache: object) -> int:
    """Bytes a cache pytree holds on device (page tables included)."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
