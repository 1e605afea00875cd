"""Pallas paged attention kernels (TPU Mosaic, GPU Triton) with jnp references, and a
weight-only int8/int4 matmul for GPU decode (Triton; checked against the float64 product).

Imports jax only, never jaxinfer. `paged_attention` / `ragged_paged_attention`
choose the kernel for the platform; the backend-specific entry points and the
references are exported for tests and benchmarks.
"""

from pallas_kernels.dispatch import (
    choose_implementation,
    paged_attention,
    ragged_paged_attention,
)
from pallas_kernels.gpu_blocks import kernel_supports, smem_footprint, unsupported_reason
from pallas_kernels.kv_quant import dequantize_kv, quantize_kv, quantize_kv_fp8
from pallas_kernels.paged_attention_gpu import paged_attention_gpu
from pallas_kernels.paged_attention_reference import (
    paged_attention_reference,
    ragged_paged_attention_reference,
)
from pallas_kernels.paged_attention_tpu import paged_attention_tpu
from pallas_kernels.quant_matmul_gpu import int4_matmul_gpu, int8_matmul_gpu
from pallas_kernels.ragged_paged_attention_gpu import ragged_paged_attention_gpu
from pallas_kernels.ragged_paged_attention_tpu import ragged_paged_attention_tpu

__all__ = [
    "choose_implementation",
    "dequantize_kv",
    "int4_matmul_gpu",
    "int8_matmul_gpu",
    "kernel_supports",
    "paged_attention",
    "paged_attention_gpu",
    "paged_attention_reference",
    "paged_attention_tpu",
    "quantize_kv",
    "quantize_kv_fp8",
    "ragged_paged_attention",
    "ragged_paged_attention_gpu",
    "ragged_paged_attention_reference",
    "ragged_paged_attention_tpu",
    "smem_footprint",
    "unsupported_reason",
]
