"""Native CPU kernels called from XLA through the FFI, for the cases XLA:CPU handles poorly."""

from jaxinfer.cpu_kernels.cache_write import write_positions
from jaxinfer.cpu_kernels.choice import kernels_available, resolve_cpu_kernels
from jaxinfer.cpu_kernels.decode_attention import (
    decode_attention,
    decode_attention_applies,
    paged_decode_attention,
)
from jaxinfer.cpu_kernels.packed_matmul import (
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
