"""Block sizes for the Triton paged kernels, from the device's shared-memory limit.

Triton keeps `num_stages` copies of each K and V block in shared memory to overlap loads with
math, plus one float32 [rows, max(head_dim, block_k)] tile for the dot operands' layout
conversion. With float32 pages, head_dim 128 and 128-key blocks that is 270336 bytes, which
is exactly what an H100 refused (232448 available); blocks are therefore chosen per dtype and
head_dim so the footprint fits. Head dims that are not a power of two (80, 96, 112...) run
zero-padded to the next one, since Triton tensor dims must be powers of two.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels._paged_common import next_power_of_2

MIN_BLOCK = 16  # Triton dots need M, N, K >= 16
DEFAULT_BLOCK_K = 128  # keys per block when shared memory allows
MAX_BLOCK_ROWS = 64  # query rows per program (the ragged kernel's largest block)
DEFAULT_NUM_STAGES = 2
# Opt-in shared memory per block by compute capability (CUDA programming guide, table 21).
SHARED_MEMORY_BY_CAPABILITY = {
    "8.0": 166912, "8.7": 166912, "8.6": 101376, "8.9": 101376,
    "9.0": 232448, "10.0": 232448, "12.0": 101376,
}
DEFAULT_SHARED_MEMORY = 232448  # H100/H200, the kernels' target; used off-GPU (interpret mode)
FALLBACK_SHARED_MEMORY = 101376  # a GPU of unknown capability: the smallest in the table


def padded_head_dim(head_dim: int) -> int:
    """The head_dim the Triton kernel computes with: the next power of two, at least 16."""
    return max(MIN_BLOCK, next_power_of_2(head_dim))


def shared_memory_limit(device: jax.Device | None = None) -> int:
    """Bytes of shared memory one program may use on `device` (default: the first device)."""
    device = device or jax.devices()[0]
    if device.platform != "gpu":
        return DEFAULT_SHARED_MEMORY
    capability = getattr(device, "compute_capability", None)
    return SHARED_MEMORY_BY_CAPABILITY.get(str(capability), FALLBACK_SHARED_MEMORY)


def smem_footprint(
    head_dim: int, kv_dtype: jnp.dtype, block_k: int, block_rows: int, num_stages: int, quantized: bool
) -> int:
    """Bytes of shared memory the kernel needs: pipelined K/V blocks plus one f32 operand tile."""
    kv_block = block_k * head_dim * jnp.dtype(kv_dtype).itemsize
    if quantized:
        kv_block += block_k * 4  # the float32 per-token scales travel with the block
    conversion_tile = block_rows * max(head_dim, block_k) * 4
    return num_stages * 2 * kv_block + conversion_tile


def choose_blocks(
    head_dim: int, kv_dtype: jnp.dtype, page_size: int, block_rows: int, quantized: bool,
    limit: int, pages_per_block: int | None = None, num_stages: int | None = None,
) -> tuple[int, int] | None:
    """(pages_per_block, num_stages) with the largest blocks that fit `limit` bytes, or None.

    Explicit arguments are kept as given (tests and benchmarks pick them on purpose); the
    others are searched: two stages before one, then the largest key block.
    """
    min_pages = max(1, -(-MIN_BLOCK // page_size))
    largest = max(min_pages, DEFAULT_BLOCK_K // page_size)
    pages_options = [max(pages_per_block, min_pages)] if pages_per_block else _halvings(largest, min_pages)
    stage_options = [num_stages] if num_stages else [DEFAULT_NUM_STAGES, 1]
    for stages in stage_options:
        for pages in pages_options:
            if smem_footprint(head_dim, kv_dtype, pages * page_size, block_rows, stages, quantized) <= limit:
                return pages, stages
    if pages_per_block and num_stages:
        return pages_options[0], num_stages
    return None


def _halvings(start: int, stop: int) -> list[int]:
    """start, start/2, ... down to stop (powers of two)."""
    out = [start]
    while out[-1] // 2 >= stop:
        out.append(out[-1] // 2)
    return out


def unsupported_reason(
    platform: str, head_dim: int, kv_dtype: jnp.dtype, page_size: int, quantized: bool = False,
    shared_memory: int | None = None,
) -> str | None:
    """Why the paged kernel for `platform` ("gpu", "tpu") cannot run this shape; None if it can."""
    if jnp.issubdtype(kv_dtype, jnp.floating) and jnp.dtype(kv_dtype).itemsize == 1:
        # Float8 loads depend on the GPU generation and were never run on hardware.
        return f"paged attention kernels read int8 or 16/32-bit float pages, not {jnp.dtype(kv_dtype).name}"
    if platform == "tpu":
        # The shapes the Mosaic kernel was lowered and interpreted with; others are untried.
        if head_dim % 64 or page_size % 8:
            return f"TPU paged attention needs head_dim % 64 == 0 and page_size % 8 == 0, got {head_dim}, {page_size}"
        return None
    if page_size != next_power_of_2(page_size):
        return f"GPU paged attention needs a power-of-two page_size, got {page_size}"
    limit = shared_memory_limit() if shared_memory is None else shared_memory
    padded = padded_head_dim(head_dim)
    if choose_blocks(padded, kv_dtype, page_size, MAX_BLOCK_ROWS, quantized, limit) is None:
        need = smem_footprint(padded, kv_dtype, max(page_size, MIN_BLOCK), MAX_BLOCK_ROWS, 1, quantized)
        return f"GPU paged attention at head_dim {head_dim} needs {need} bytes of shared memory, {limit} available"
    return None


def kernel_supports(
    head_dim: int, dtype: jnp.dtype, page_size: int, platform: str, quantized: bool = False,
    shared_memory: int | None = None,
) -> bool:
    """True when the Pallas paged kernel for `platform` handles this shape (else use the reference)."""
    return unsupported_reason(platform, head_dim, dtype, page_size, quantized, shared_memory) is None
