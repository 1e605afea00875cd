"""Packed low-bit weights of AWQ, GPTQ and compressed-tensors checkpoints, unpacked to integer levels.

Every format packs 32 // bits unsigned values into each int32, value i in bits [bits * i, bits * (i + 1)),
and a weight W [out, in] reads as (level - zero) * scale, with one scale and zero level per output and
group of inputs. Where the formats differ (the scheme: `config.packed_checkpoint.PackedScheme`):

- AWQ (AutoAWQ GEMM) `qweight` int32 [in, out / 8] packs along the OUTPUT axis in the order
  [0, 2, 4, 6, 1, 3, 5, 7] (value i of a word is output 8c + AWQ_ORDER[i]); `qzeros` int32
  [in / group, out / 8] the same way; `scales` fp16 [in / group, out].
- GPTQ `qweight` int32 [in * bits / 32, out] packs along the INPUT axis in order; `qzeros` int32
  [groups, out * bits / 32] along the output axis in order, each zero point stored minus one in the v1
  format (`zero_offset` 1; a stored 15 reads 16); `scales` fp16 [groups, out]; `g_idx` int32 [in] each
  input's group (act order: not sorted), absent meaning input // group.
- compressed-tensors `pack-quantized` `weight_packed` int32 [out, in * bits / 32] packs along the input
  axis in order (signed values stored plus 2 ** (bits - 1)); `weight_zero_point` int32
  [out * bits / 32, groups] along the output axis, likewise offset (asymmetric only: symmetric weights'
  zero level is 2 ** (bits - 1)); `weight_scale` [out, groups] in the model's dtype; `weight_shape`
  [2] the unpacked shape; `weight_g_idx` [in] as GPTQ's.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from jaxinfer.config.packed_checkpoint import PackedScheme

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# The tensors beside each packed weight, by format: (the values' suffix, the others' suffixes). A weight
# named "x.weight" has them at "x." + suffix.
COMPONENTS = {
    "awq": ("qweight", ("qzeros", "scales")),
    "gptq": ("qweight", ("qzeros", "scales", "g_idx")),
    "compressed-tensors": ("weight_packed", ("weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")),
}


@dataclasses.dataclass(frozen=True)
class Levels:
    """A weight W [out, in] as integer levels: W[o, i] = (codes[o, i] - zeros[o, g]) * scales[o, g], g = groups[i]."""

    codes: np.ndarray  # uint8 [out, in], 0 .. 2 ** bits - 1
    zeros: np.ndarray  # int16 [out, groups] (a GPTQ v1 zero point can read 2 ** bits)
    scales: np.ndarray  # [out, groups] as stored (float16, bfloat16 or float32)
    groups: np.ndarray  # int [in]

    def dequantized(self) -> np.ndarray:
        """W as float32: exact for 16-bit scales (an 8-bit level difference times an 11-bit mantissa)."""
        levels = self.codes.astype(np.float32) - self.zeros[:, self.groups]
        return levels * self.scales.astype(np.float32)[:, self.groups]


def unpack(packed: np.ndarray, bits: int, axis: int, order: tuple[int, ...] | None = None) -> np.ndarray:
    """int32 words -> uint8 values, `axis` 32 // bits times as long; value i of each word lands at position
    order[i] of its run (in order when None)."""
    per = 32 // bits
    words = np.ascontiguousarray(packed).view(np.uint32)
    fields = [((words >> (bits * i)) & ((1 << bits) - 1)).astype(np.uint8) for i in range(per)]
    if order is not None:
        fields = [fields[order.index(position)] for position in range(per)]
    stacked = np.stack(fields, axis=axis + 1)  # [..., words, per, ...]
    shape = list(packed.shape)
    shape[axis] *= per
    return stacked.reshape(shape)


def _groups(inputs: int, group: int, g_idx: np.ndarray | None) -> np.ndarray:
    if g_idx is not None:
        return np.asarray(g_idx).astype(np.int64)
    return np.arange(inputs) // (group or inputs)


def awq_levels(parts: Mapping[str, np.ndarray], scheme: PackedScheme) -> Levels:
    """An AutoAWQ GEMM weight's levels."""
    codes = unpack(parts["qweight"], scheme.bits, 1, AWQ_ORDER).T
    zeros = unpack(parts["qzeros"], scheme.bits, 1, AWQ_ORDER).T.astype(np.int16)
    return Levels(np.ascontiguousarray(codes), zeros, parts["scales"].T, _groups(codes.shape[1], scheme.group, None))


def gptq_levels(parts: Mapping[str, np.ndarray], scheme: PackedScheme) -> Levels:
    """A GPTQ weight's levels (v1 zero points read plus one)."""
    codes = unpack(parts["qweight"], scheme.bits, 0).T
    zeros = unpack(parts["qzeros"], scheme.bits, 1).T.astype(np.int16) + scheme.zero_offset
    groups = _groups(codes.shape[1], scheme.group, parts.get("g_idx"))
    return Levels(np.ascontiguousarray(codes), zeros, parts["scales"].T, groups)


def compressed_levels(parts: Mapping[str, np.ndarray], scheme: PackedScheme) -> Levels:
    """A compressed-tensors pack-quantized weight's levels, cut to `weight_shape`."""
    out, inputs = (int(n) for n in parts["weight_shape"])
    codes = unpack(parts["weight_packed"], scheme.bits, 1)[:out, :inputs]
    scales = parts["weight_scale"].reshape(out, -1)
    if scheme.symmetric:
        zeros = np.full(scales.shape, 1 << (scheme.bits - 1), np.int16)
    else:
        zeros = unpack(parts["weight_zero_point"], scheme.bits, 0)[:out].astype(np.int16)
    return Levels(codes, zeros, scales, _groups(inputs, scheme.group, parts.get("weight_g_idx")))


READERS = {"awq": awq_levels, "gptq": gptq_levels, "compressed-tensors": compressed_levels}


def levels(parts: Mapping[str, np.ndarray], scheme: PackedScheme) -> Levels:
    """A packed weight's levels from its stored tensors, by suffix ("qweight", "scales", ...)."""
    return READERS[scheme.method](parts, scheme)
