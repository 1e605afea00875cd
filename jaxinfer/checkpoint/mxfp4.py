"""MXFP4 tensors of an HF checkpoint (GPT-OSS's experts), dequantized as they are read.

The OCP microscaling format: each run of 32 values along a row's input axis shares one power-of-two
scale (a uint8 exponent biased by 127, `{name}_scales` [..., rows, groups]), and each value is a 4-bit
E2M1 float, two to a byte, low nibble first (`{name}_blocks` [..., rows, groups, 16]). Rows are a
linear layer's outputs, so a tensor stored [E, out, in] is presented as the unquantized checkpoint
stores it, [E, in, out]; families describe it by its unquantized name and never see the difference.
Every E2M1 value times a power of two is exact in bfloat16 and float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BLOCKS, SCALES = "_blocks", "_scales"
GROUP = 32  # values sharing one scale
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                np.float32)


def packed_names(names: set[str] | list[str]) -> dict[str, tuple[str, str]]:
    """Unquantized name -> (blocks name, scales name) of each MXFP4 pair among a checkpoint's tensor names."""
    present = set(names)
    return {name[: -len(BLOCKS)]: (name, name[: -len(BLOCKS)] + SCALES) for name in present
            if name.endswith(BLOCKS) and name[: -len(BLOCKS)] + SCALES in present}


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks [..., rows, groups, 16] uint8 and scales [..., rows, groups] uint8 -> [..., rows, groups * 32] f32."""
    low, high = E2M1[blocks & 0x0F], E2M1[blocks >> 4]
    values = np.stack([low, high], axis=-1).reshape(*blocks.shape[:-1], GROUP)
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    return values.reshape(*blocks.shape[:-2], -1)


class Mxfp4Slice:
    """A stored MXFP4 pair (safetensors slices, or arrays) read like a safetensors slice of the
    unquantized [..., in, out] tensor."""

    def __init__(self, blocks: Any, scales: Any):
        self._blocks, self._scales = blocks, scales
        *lead, rows, groups, _ = blocks.get_shape() if hasattr(blocks, "get_shape") else blocks.shape
        self._shape = (*lead, groups * GROUP, rows)

    def get_shape(self) -> tuple[int, ...]:
        """The unquantized shape [..., in, out]."""
        return self._shape

    def __getitem__(self, index: tuple[slice, ...]) -> np.ndarray:
        """The dequantized float32 slice; only the scale groups covering its inputs are read."""
        index = tuple(index) + (slice(None),) * (len(self._shape) - len(tuple(index)))
        *lead, inputs, outputs = (s.indices(n) for s, n in zip(index, self._shape))
        if any(step != 1 for _, _, step in (*lead, inputs, outputs)):
            raise ValueError(f"MXFP4 tensors are read in contiguous slices, got {index}")
        first, last = inputs[0] // GROUP, -(-inputs[1] // GROUP)
        lead_index = tuple(slice(start, stop) for start, stop, _ in lead)
        rows = slice(outputs[0], outputs[1])
        blocks = np.asarray(self._blocks[(*lead_index, rows, slice(first, last))])
        scales = np.asarray(self._scales[(*lead_index, rows, slice(first, last))])
        values = np.swapaxes(dequantize(blocks, scales), -1, -2)  # [..., in, out]
        offset = first * GROUP
        return values[..., inputs[0] - offset : inputs[1] - offset, :]
