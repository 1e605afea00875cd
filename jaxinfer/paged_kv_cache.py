"""Paged KV cache: per-layer page pools indexed through a per-sequence page table.

Pages are `[num_kv_heads, num_pages, page_size, head_dim]` per layer, the layout the Pallas
kernels read. With `int8` storage each page also has per-token-per-head float32 scales and
K/V are quantized on write. The page table and the attention backend travel with the cache so
the model code is the same for every cache type.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config import ModelConfig
from jaxinfer.sharding import UNSHARDED, Layout
from pallas_kernels import quantize_kv

# Pools split by kv heads over tp; pages are shared by every row (any row may map any page),
# so they are not split over dp.
POOL_AXES = ("kv_heads", None, None, "head_dim")  # [KV, P, page_size, K]
SCALE_AXES = ("kv_heads", None, None)  # [KV, P, page_size]


@dataclasses.dataclass
class PagedKVCache:
    """Page pools per layer plus the page table mapping (sequence, page slot) -> page."""

    k_pages: list[jax.Array]  # L x [KV, P, page_size, K]
    v_pages: list[jax.Array]  # L x [KV, P, page_size, K]
    k_scales: list[jax.Array] | None  # L x [KV, P, page_size] float32 (int8 storage only)
    v_scales: list[jax.Array] | None
    page_table: jax.Array  # [B, pages_per_seq] int32
    backend: str = "reference"  # static: "reference" | "pallas"
    interpret: bool = False  # static: run Pallas kernels in interpret mode (CPU tests)
    bits_of: str | None = None  # static: pools hold uint16 bit patterns of this 16-bit float dtype
    cpu_kernels: bool = False  # static: the gathered CPU attention may use the native decode kernel
    layout: Layout = UNSHARDED  # static: mesh and rules of the pools (and the model's activations)

    @property
    def page_size(self) -> int:
        """Tokens per page."""
        return self.k_pages[0].shape[2]

    @property
    def max_seq_len(self) -> int:
        """Positions each sequence's page table can address."""
        return self.page_table.shape[1] * self.page_size

    @property
    def quantized(self) -> bool:
        """True when pages hold int8 values with scales."""
        return self.k_scales is not None

    def to_storage(self, values: jax.Array) -> jax.Array:
        """values in the pools' storage dtype (16-bit floats as their bits when bits_of is set)."""
        if self.bits_of is None:
            return values.astype(self.k_pages[0].dtype)
        return jax.lax.bitcast_convert_type(values.astype(self.bits_of), jnp.uint16)

    def from_storage(self, stored: jax.Array) -> jax.Array:
        """Stored page values back in their float dtype."""
        if self.bits_of is None:
            return stored
        return jax.lax.bitcast_convert_type(stored, jnp.dtype(self.bits_of))

    def _slots(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(page, offset) [B, T] for positions [B, T]; positions beyond the table map past the pool."""
        num_pages = self.k_pages[0].shape[1]
        slot = positions // self.page_size
        in_range = (positions >= 0) & (slot < self.page_table.shape[1])
        page = jnp.take_along_axis(self.page_table, jnp.clip(slot, 0, self.page_table.shape[1] - 1), axis=1)
        return jnp.where(in_range, page, num_pages), positions % self.page_size

    def write(self, layer: int, k: jax.Array, v: jax.Array, positions: jax.Array) -> "PagedKVCache":
        """Store k/v [B, T, KV, K] of `layer` at positions [B, T]; out-of-range writes are dropped."""
        page, offset = self._slots(positions)
        k_pages, v_pages = list(self.k_pages), list(self.v_pages)
        k_scales = list(self.k_scales) if self.quantized else None
        v_scales = list(self.v_scales) if self.quantized else None
        for pages, scales, new in ((k_pages, k_scales, k), (v_pages, v_scales, v)):
            values = jnp.swapaxes(jnp.swapaxes(new, 1, 2), 0, 1)  # [KV, B, T, K]
            if scales is not None:
                values, new_scales = quantize_kv(values)
                new_scales = scales[layer].at[:, page, offset].set(new_scales, mode="drop")
                scales[layer] = self.layout.constrain(new_scales, SCALE_AXES)
            new_pages = pages[layer].at[:, page, offset].set(self.to_storage(values), mode="drop")
            pages[layer] = self.layout.constrain(new_pages, POOL_AXES)
        return dataclasses.replace(self, k_pages=k_pages, v_pages=v_pages, k_scales=k_scales, v_scales=v_scales)


jax.tree_util.register_dataclass(
    PagedKVCache,
    data_fields=["k_pages", "v_pages", "k_scales", "v_scales", "page_table"],
    meta_fields=["backend", "interpret", "bits_of", "cpu_kernels", "layout"],
)


def identity_page_table(batch: int, pages_per_seq: int) -> np.ndarray:
    """Sequence b owns pages b*pages_per_seq ... (the static-batch layout)."""
    return np.arange(batch * pages_per_seq, dtype=np.int32).reshape(batch, pages_per_seq)


def init_paged_cache(
    cfg: ModelConfig,
    batch: int,
    max_seq_len: int,
    dtype: jnp.dtype,
    page_size: int = 16,
    kv_dtype: str = "auto",
    backend: str = "reference",
    interpret: bool = False,
    page_table: np.ndarray | None = None,
    layout: Layout = UNSHARDED,
) -> PagedKVCache:
    """A zeroed paged cache with enough pages for `batch` sequences of `max_seq_len` tokens."""
    pages_per_seq = math.ceil(max_seq_len / page_size)
    table = identity_page_table(batch, pages_per_seq) if page_table is None else page_table
    num_pages = int(table.max()) + 1
    shape = (cfg.num_kv_heads, num_pages, page_size, cfg.head_dim)
    store = jnp.int8 if kv_dtype == "int8" else dtype

    def pool(dt: jnp.dtype, shp: tuple[int, ...], axes: tuple) -> list[jax.Array]:
        return [layout.zeros(shp, dt, axes) for _ in range(cfg.num_layers)]

    scales = (lambda: pool(jnp.float32, shape[:3], SCALE_AXES)) if kv_dtype == "int8" else (lambda: None)
    return PagedKVCache(
        k_pages=pool(store, shape, POOL_AXES),
        v_pages=pool(store, shape, POOL_AXES),
        k_scales=scales(),
        v_scales=scales(),
        page_table=layout.put(np.asarray(table, np.int32)),
        backend=backend,
        interpret=interpret,
        layout=layout,
    )


def page_bytes(cfg: ModelConfig, page_size: int, dtype: jnp.dtype, kv_dtype: str = "auto") -> int:
    """Device bytes of one page across all layers (keys, values and int8 scales)."""
    per_token = cfg.num_kv_heads * cfg.head_dim * (1 if kv_dtype == "int8" else jnp.dtype(dtype).itemsize)
    scales = cfg.num_kv_heads * 4 if kv_dtype == "int8" else 0
    return 2 * cfg.num_layers * page_size * (per_token + scales)


def init_page_pool(
    cfg: ModelConfig,
    num_pages: int,
    page_size: int,
    dtype: jnp.dtype,
    kv_dtype: str = "auto",
    backend: str = "reference",
    interpret: bool = False,
    cpu_kernels: bool = False,
    layout: Layout = UNSHARDED,
) -> PagedKVCache:
    """A zeroed pool of num_pages pages for the engine (its page table is supplied per step).

    On the jnp reference path 16-bit float pages are stored as uint16 bits: XLA:CPU widens a
    bf16/f16 scatter to float32 and copies the whole pool on every write, integers it
    updates in place.
    """
    placeholder = np.full((1, 1), num_pages - 1, np.int32)
    as_bits = kv_dtype == "auto" and backend == "reference" and jnp.dtype(dtype).itemsize == 2
    pool = init_paged_cache(
        cfg, 1, page_size, jnp.uint16 if as_bits else dtype, page_size=page_size, kv_dtype=kv_dtype,
        backend=backend, interpret=interpret, page_table=placeholder, layout=layout,
    )
    return dataclasses.replace(pool, bits_of=jnp.dtype(dtype).name if as_bits else None, cpu_kernels=cpu_kernels)
