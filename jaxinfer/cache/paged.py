"""Paged KV cache: per-layer page pools indexed through a per-sequence page table.

Pages are `[num_kv_heads, num_pages, page_size, head_dim]` per layer, the layout the Pallas
kernels read. With `int8` or `fp8` (e4m3) storage each page also has per-token-per-head
float32 scales and K/V are quantized on write. The page table and the attention backend travel with the cache so
the model code is the same for every cache type.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.cache import per_layer
from jaxinfer.config.model import ModelConfig
from jaxinfer.parallel.sharding import UNSHARDED, Layout
from pallas_kernels import quantize_kv, quantize_kv_fp8

QUANTIZED_KV = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}  # kv_cache_dtype -> stored values

# Pools split by kv heads over tp; pages are shared by every row (any row may map any page),
# so they are not split over dp.
POOL_AXES = ("kv_heads", None, None, "head_dim")  # [KV, P, page_size, K]
SCALE_AXES = ("kv_heads", None, None)  # [KV, P, page_size]


@dataclasses.dataclass
class PagedKVCache:
    """Page pools per layer plus the page table mapping (sequence, page slot) -> page."""

    k_pages: list[jax.Array]  # L x [KV, P, page_size, K]
    v_pages: list[jax.Array]  # L x [KV, P, page_size, K]
    k_scales: list[jax.Array] | None  # L x [KV, P, page_size] float32 (int8/fp8 storage only)
    v_scales: list[jax.Array] | None
    page_table: jax.Array  # [B, pages_per_seq] int32
    # A model with Mamba2 layers (cache/state_pool): per layer, None for attention layers (whose K/V pools are
    # the ones above; a state layer's are empty): the conv state [S, K-1, C] and SSM state [S, H, P, N]
    # (float32) of each row slot S. None for attention-only models.
    conv_states: list[jax.Array | None] | None = None
    ssm_states: list[jax.Array | None] | None = None
    # An encoder-decoder model (Whisper, cache/cross_pool): per layer the cross-attention keys and values
    # [S, F, H, K] of each row slot S; None for decoder-only models.
    cross_keys: list[jax.Array] | None = None
    cross_values: list[jax.Array] | None = None
    backend: str = "reference"  # static: "reference" | "pallas"
    interpret: bool = False  # static: run Pallas kernels in interpret mode (CPU tests)
    bits_of: str | None = None  # static: pools hold the unsigned-integer bits of this fp8/16-bit float dtype
    cpu_kernels: bool = False  # static: the gathered CPU attention may use the native decode kernel
    layout: Layout = UNSHARDED  # static: mesh and rules of the pools (and the model's activations)
    # static: the platform whose kernels a "pallas" backend runs ("tpu", "gpu"; None: the default
    # backend's), so a program can be lowered for a platform this process does not run on
    platform: str | None = None
    # static: attention does the same arithmetic for a token whatever else is in its step (LLM's
    # batch_invariant): GPU kernels split no row's keys (their split count follows the batch size),
    # the jnp path attends tokens in blocks of exactly TOKEN_BLOCK rows
    batch_invariant: bool = False

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
        """True when pages hold int8 or fp8 values with scales."""
        return self.k_scales is not None

    @property
    def value_dtype(self) -> jnp.dtype:
        """What the pages hold (the float dtype when they store its bits)."""
        return jnp.dtype(self.bits_of) if self.bits_of is not None else self.k_pages[0].dtype

    def to_storage(self, values: jax.Array) -> jax.Array:
        """values in the pools' storage dtype (fp8/16-bit floats as their bits when bits_of is set)."""
        if self.bits_of is None:
            return values.astype(self.k_pages[0].dtype)
        return jax.lax.bitcast_convert_type(values.astype(self.bits_of), self.k_pages[0].dtype)

    def from_storage(self, stored: jax.Array) -> jax.Array:
        """Stored page values back in their float dtype."""
        if self.bits_of is None:
            return stored
        return jax.lax.bitcast_convert_type(stored, jnp.dtype(self.bits_of))

    def quantize(self, values: jax.Array) -> tuple[jax.Array, jax.Array]:
        """values [..., K] -> (int8 or fp8 values, float32 scales [...]) for these pages."""
        return quantize_kv_fp8(values) if self.value_dtype == jnp.float8_e4m3fn else quantize_kv(values)

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
                values, new_scales = self.quantize(values)
                new_scales = scales[layer].at[:, page, offset].set(new_scales, mode="drop")
                scales[layer] = self.layout.constrain(new_scales, SCALE_AXES)
            new_pages = pages[layer].at[:, page, offset].set(self.to_storage(values), mode="drop")
            pages[layer] = self.layout.constrain(new_pages, POOL_AXES)
        return dataclasses.replace(self, k_pages=k_pages, v_pages=v_pages, k_scales=k_scales, v_scales=v_scales)

    def layer_view(self, layer: int) -> "PagedKVCache":
        """These pools of `layer` alone, as layer 0 (see models.layer_calls)."""
        return per_layer.layer_view(self, LAYERED, layer)

    def with_layer(self, layer: int, view: "PagedKVCache") -> "PagedKVCache":
        """This cache with `layer`'s pools taken from a one-layer view."""
        return per_layer.with_layer(self, LAYERED, layer, view)


# one buffer per layer
LAYERED = ("k_pages", "v_pages", "k_scales", "v_scales", "conv_states", "ssm_states", "cross_keys", "cross_values")

jax.tree_util.register_dataclass(
    PagedKVCache,
    data_fields=["k_pages", "v_pages", "k_scales", "v_scales", "page_table", "conv_states", "ssm_states",
                 "cross_keys", "cross_values"],
    meta_fields=["backend", "interpret", "bits_of", "cpu_kernels", "layout", "platform", "batch_invariant"],
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
    storage: jnp.dtype | None = None,
) -> PagedKVCache:
    """A zeroed paged cache with enough pages for `batch` sequences of `max_seq_len` tokens.

    storage overrides the pages' dtype (bits of the values' float dtype, see init_page_pool).
    """
    pages_per_seq = math.ceil(max_seq_len / page_size)
    table = identity_page_table(batch, pages_per_seq) if page_table is None else page_table
    num_pages = int(table.max()) + 1
    store = QUANTIZED_KV.get(kv_dtype, dtype) if storage is None else storage

    def pool(dt: jnp.dtype, axes: tuple, scale: bool = False) -> list[jax.Array]:
        # A layer that keeps no K/V (a state layer, Nemotron-H's MLP layers, a Gemma 4 layer reading another's):
        # its buffers are empty (width 0), its pages cost nothing. Replicated: a program returns an empty array
        # replicated whatever its input's sharding, and a program compiled for kv heads over tp would refuse that
        # buffer on its next call. Each layer's own kv heads and head dim (Gemma 4's global layers differ).
        buffers = []
        for i in range(cfg.num_layers):
            heads, head_dim = cfg.kv_shape(i)
            shp = (heads, num_pages, page_size) if scale else (heads, num_pages, page_size, head_dim)
            keeps = cfg.keeps_kv(i)
            buffers.append(layout.zeros(shp if keeps else (*shp[:-1], 0), dt, axes if keeps else (None,) * len(shp)))
        return buffers

    scales = (lambda: pool(jnp.float32, SCALE_AXES, True)) if kv_dtype in QUANTIZED_KV else (lambda: None)
    return PagedKVCache(
        k_pages=pool(store, POOL_AXES),
        v_pages=pool(store, POOL_AXES),
        k_scales=scales(),
        v_scales=scales(),
        page_table=layout.put(np.asarray(table, np.int32)),
        backend=backend,
        interpret=interpret,
        layout=layout,
    )


def page_bytes(cfg: ModelConfig, page_size: int, dtype: jnp.dtype, kv_dtype: str = "auto") -> int:
    """Device bytes of one page across all attention layers (keys, values and int8/fp8 scales; state layers
    keep none)."""
    quantized = kv_dtype in QUANTIZED_KV
    itemsize = 1 if quantized else jnp.dtype(dtype).itemsize
    per_token = 0
    for layer in [i for i in range(cfg.num_layers) if cfg.keeps_kv(i)]:  # each its own shape (Gemma 4)
        heads, head_dim = cfg.kv_shape(layer)
        per_token += heads * head_dim * itemsize + (heads * 4 if quantized else 0)
    return 2 * page_size * per_token


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

    On the jnp reference path 16-bit and fp8 pages are stored as unsigned-integer bits: XLA:CPU
    widens a bf16/f16/fp8 scatter to float32 and copies the whole pool on every write,
    integers it updates in place.
    """
    placeholder = np.full((1, 1), num_pages - 1, np.int32)
    value = jnp.dtype(QUANTIZED_KV.get(kv_dtype, dtype))
    as_bits = backend == "reference" and jnp.issubdtype(value, jnp.floating) and value.itemsize <= 2
    bits = {1: jnp.uint8, 2: jnp.uint16}.get(value.itemsize) if as_bits else None
    pool = init_paged_cache(
        cfg, 1, page_size, dtype, page_size=page_size, kv_dtype=kv_dtype,
        backend=backend, interpret=interpret, page_table=placeholder, storage=bits, layout=layout,
    )
    return dataclasses.replace(pool, bits_of=value.name if as_bits else None, cpu_kernels=cpu_kernels)
