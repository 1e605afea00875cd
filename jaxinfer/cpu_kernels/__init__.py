"""Native CPU kernels called from XLA through the FFI, for the cases XLA:CPU handles poorly."""

from jaxinfer.cpu_kernels.cache_write import cache_write_applies, write_positions
from jaxinfer.cpu_kernels.decode_attention import (
    decode_attention,
    decode_attention_applies,
)
from jaxinfer.cpu_kernels.gemv import bf16_gemv, gemv_applies

__all__ = [
    "bf16_gemv",
    "cache_write_applies",
    "decode_attention",
    "decode_attention_applies",
    "gemv_applies",
    "write_positions",
]
