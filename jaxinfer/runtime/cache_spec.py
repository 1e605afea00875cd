"""How an LLM's KV pages are kept: page size, storage dtype and attention backend."""

from __future__ import annotations

import dataclasses

from jaxinfer.models.attention import resolve_backend
from jaxinfer.parallel.sharding import UNSHARDED, Layout

KV_DTYPES = ("auto", "int8", "fp8")  # fp8: float8_e4m3fn values with per-token-per-head scales


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    """A validated cache choice (the runner's pools are made from it: runtime/pools)."""

    page_size: int = 16
    kv_dtype: str = "auto"
    attention_backend: str = "auto"
    interpret: bool = False  # Pallas kernels in interpret mode (CPU checks of the kernel path)
    cpu_kernels: bool = False  # the pools and the prompt-logprobs pass use the native CPU kernels
    mesh_layout: Layout = UNSHARDED  # the mesh the caches are split over (by batch and kv heads)
    batch_invariant: bool = False  # attention of the same arithmetic for a row in any batch (PagedKVCache)

    def __post_init__(self) -> None:
        if self.cpu_kernels and self.mesh_layout.size > 1:
            # FFI custom calls have no partitioning rule: XLA cannot split them over a mesh.
            raise ValueError(f"cpu_kernels=True cannot run on a mesh of {self.mesh_layout.size} devices; use cpu_kernels=False")
        if self.cpu_kernels and self.batch_invariant:
            raise ValueError("batch_invariant=True runs without the native CPU kernels, whose per-row results "
                             "depend on the batch; leave cpu_kernels unset or False")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_cache_dtype {self.kv_dtype!r} is not one of {', '.join(KV_DTYPES)}")
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        object.__setattr__(self, "attention_backend", resolve_backend(self.attention_backend))
