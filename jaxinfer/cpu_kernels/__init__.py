"""Native CPU kernels called from XLA through the FFI, for the cases XLA:CPU handles poorly."""

from jaxinfer.cpu_kernels.cache_write import cache_write_applies, write_positions
from jaxinfer.cpu_kernels.decode_attention import (
    decode_attention,
    decode_attention_applies,
)
from jaxinfer.cpu_kernels.packed_matmul import (
    PackedWeight,
    pack_weight,
    packed_matmul,
    packing_applies,
    unpack_weight,
)

__all__ = [
    "PackedWeight",
    "cache_write_applies",
    "decode_attention",
    "decode_attention_applies",
    "pack_weight",
    "packed_matmul",
    "packing_applies",
    "unpack_weight",
    "write_positions",
]
