"""Which KV cache an LLM allocates: layout, page size, storage dtype and attention backend."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxinfer.cache.contiguous import KVCache, init_cache
from jaxinfer.cache.paged import PagedKVCache, init_paged_cache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models.attention import resolve_backend
from jaxinfer.parallel.sharding import UNSHARDED, Layout

LAYOUTS = ("auto", "contiguous", "paged")
KV_DTYPES = ("auto", "int8", "fp8")  # fp8: float8_e4m3fn values with per-token-per-head scales


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    """A validated cache choice; `make` allocates one for a batch bucket."""

    layout: str = "auto"
    page_size: int = 16
    kv_dtype: str = "auto"
    attention_backend: str = "auto"
    interpret: bool = False  # Pallas kernels in interpret mode (CPU checks of the kernel path)
    cpu_kernels: bool = False  # the contiguous cache's writes and decode attention use the CPU kernels
    mesh_layout: Layout = UNSHARDED  # the mesh the caches are split over (by batch and kv heads)

    def __post_init__(self) -> None:
        if self.cpu_kernels and self.mesh_layout.size > 1:
            # FFI custom calls have no partitioning rule: XLA cannot split them over a mesh.
            raise ValueError(f"cpu_kernels=True cannot run on a mesh of {self.mesh_layout.size} devices; use cpu_kernels=False")
        if self.layout not in LAYOUTS:
            raise ValueError(f"kv_cache {self.layout!r} is not one of {', '.join(LAYOUTS)}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_cache_dtype {self.kv_dtype!r} is not one of {', '.join(KV_DTYPES)}")
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        object.__setattr__(self, "attention_backend", resolve_backend(self.attention_backend))
        if self.layout == "auto":
            # The dense path is fastest on CPU; kernels, int8 KV and interpret mode need pages (fp8 has both).
            wants_pages = self.attention_backend == "pallas" or self.kv_dtype == "int8" or self.interpret
            object.__setattr__(self, "layout", "paged" if wants_pages else "contiguous")
        if self.layout == "contiguous" and (self.kv_dtype == "int8" or self.attention_backend == "pallas"):
            raise ValueError("int8 KV and the Pallas attention backend need kv_cache='paged'")

    def make(self, cfg: ModelConfig, batch: int, max_seq_len: int, dtype: jnp.dtype) -> KVCache | PagedKVCache:
        """A zeroed cache for `batch` sequences of up to `max_seq_len` tokens."""
        if self.layout == "contiguous":
            return init_cache(cfg, batch, max_seq_len, dtype, self.cpu_kernels, self.mesh_layout, kv_dtype=self.kv_dtype)
        return init_paged_cache(
            cfg, batch, max_seq_len, dtype, page_size=self.page_size, kv_dtype=self.kv_dtype,
            backend=self.attention_backend, interpret=self.interpret, layout=self.mesh_layout,
        )
