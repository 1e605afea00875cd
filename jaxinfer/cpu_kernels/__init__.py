"""Native CPU kernels called from XLA through the FFI, for the cases XLA:CPU handles poorly."""

from jaxinfer.cpu_kernels.gemv import bf16_gemv, gemv_applies

__all__ = ["bf16_gemv", "gemv_applies"]
