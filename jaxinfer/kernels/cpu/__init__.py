"""Native CPU kernels called from XLA through the FFI, for the cases XLA:CPU handles poorly."""

from jaxinfer.kernels.cpu.cache_write import write_positions
from jaxinfer.kernels.cpu.choice import kernels_available, resolve_cpu_kernels
from jaxinfer.kernels.cpu.decode_attention import (
    decode_attention,
    decode_attention_applies,
    paged_decode_attention,
)
from jaxinfer.kernels.cpu.packed_matmul import (
    PackedWeight,
    pack_weight,
    packed_matmul,
    packed_matmuls,
    packing_applies,
    unpack_weight,
)

__all__ = [
    "PackedWeight",
    "decode_attention",
    "decode_attention_applies",
    "paged_decode_attention",
    "kernels_available",
    "pack_weight",
    "packed_matmul",
    "packed_matmuls",
    "packing_applies",
    "resolve_cpu_kernels",
    "unpack_weight",
    "write_positions",
]
