"""Linear weights stored as 8-bit values times scales, dequantized as they are read.

Block-wise FP8 checkpoints (DeepSeek-V3/R1, Kimi-K2, Qwen3-*-FP8, GLM-4.5-FP8) and llm-compressor's
8-bit compressed-tensors ones store a weight as FP8 e4m3 or int8 values [..., out, in] and its
scales beside it (`config.scaled_checkpoint.ScaleScheme`: the scales' name, what each covers;
ue8m0 scales are powers of two stored as uint8 exponents biased by 127); weights the quantizer
skipped (norms, routers, embeddings, the head) are stored as they are. The weight reads as the
product, in the stored layout, so families describe it as an unquantized checkpoint and never
see the difference.

safetensors' NumPy reader has no float8 type, so FP8 values are read as their bytes from a memory
map of the file and decoded through a 256-entry table.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import ml_dtypes
import numpy as np

# Per-tensor activation scales of a static scheme: weight-only dequantization has no use for them.
ACTIVATION_SCALES = ("activation_scale", "input_scale")
E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
FP8_DTYPES = ("F8_E4M3",)


def packed_names(names: set[str] | list[str] | Mapping[str, Any], suffix: str) -> dict[str, str]:
    """Weight name -> its scales' name, for each scaled weight among a checkpoint's tensor names."""
    present = set(names)
    return {name: name + suffix for name in present if name + suffix in present}


def is_activation_scale(name: str) -> bool:
    """Whether a tensor is a static scheme's activation scale (read by no one here)."""
    return name.rsplit(".", 1)[-1] in ACTIVATION_SCALES


def stored_dtype(path: Path, name: str) -> str:
    """A tensor's safetensors dtype name ("F8_E4M3", "I8", ...), read from the file's header."""
    return _header(path)[0][name]["dtype"]


def _header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header and the offset its data starts at."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size)), 8 + size


def raw_bytes(path: Path, name: str) -> np.ndarray:
    """FP8 tensor `name` of a safetensors file as a read-only memory map of its bytes, in its shape."""
    header, start = _header(path)
    entry = header[name]
    if entry["dtype"] not in FP8_DTYPES:
        raise ValueError(f"{name} in {path.name} is {entry['dtype']}, not one of the FP8 types {FP8_DTYPES}")
    begin, end = entry["data_offsets"]
    shape = tuple(entry["shape"])
    if end - begin != math.prod(shape):
        raise ValueError(f"{name} in {path.name}: {end - begin} bytes for shape {shape}")
    return np.memmap(path, dtype=np.uint8, mode="r", offset=start + begin, shape=shape)


class Fp8Values:
    """FP8 e4m3 values read like a safetensors slice, as float32."""

    def __init__(self, raw: np.ndarray):
        self._raw = raw

    def get_shape(self) -> tuple[int, ...]:
        return tuple(self._raw.shape)

    def __getitem__(self, index: tuple[slice, ...]) -> np.ndarray:
        return E4M3[np.asarray(self._raw[index])]


def scale_values(scales: np.ndarray) -> np.ndarray:
    """Stored scales as float32: ue8m0 exponents (uint8) as powers of two, floats as they are."""
    if scales.dtype == np.uint8:
        return np.ldexp(np.float32(1.0), scales.astype(np.int32) - 127).astype(np.float32)
    return scales.astype(np.float32)


def whole(tensor: Any) -> np.ndarray:
    """A safetensors slice read whole."""
    return np.asarray(tensor[tuple(slice(None) for _ in tensor.get_shape())])


class ScaledSlice:
    """A stored weight (values and scales, lazily read) read like a safetensors slice of the dequantized
    tensor, in the stored shape [..., out, in].

    block: (rows, cols) one scale covers, 0 = the whole axis; None = one scale for the tensor.
    """

    def __init__(self, values: Any, scales: Any, block: tuple[int, int] | None):
        self._values, self._scales = values, scales
        shape = self.get_shape()
        self._block = None if block is None else tuple(n or dim for n, dim in zip(block, shape[-2:]))

    def get_shape(self) -> tuple[int, ...]:
        return tuple(self._values.get_shape())

    def __getitem__(self, index: tuple[slice, ...]) -> np.ndarray:
        """The float32 slice: its values times the scale of each block it covers (only those read)."""
        shape = self.get_shape()
        index = tuple(index) + (slice(None),) * (len(shape) - len(tuple(index)))
        bounds = [s.indices(n) for s, n in zip(index, shape)]
        if any(step != 1 for _, _, step in bounds):
            raise ValueError(f"scaled tensors are read in contiguous slices, got {index}")
        values = np.asarray(self._values[tuple(slice(a, b) for a, b, _ in bounds)], np.float32)
        if self._block is None:
            return values * scale_values(whole(self._scales)).reshape(())
        *lead, (r0, r1, _), (c0, c1, _) = bounds
        rows, cols = self._block
        blocks = tuple(slice(a, b) for a, b, _ in lead) + (slice(r0 // rows, -(-r1 // rows)),
                                                          slice(c0 // cols, -(-c1 // cols)))
        scales = scale_values(np.asarray(self._scales[blocks]))
        scales = np.repeat(np.repeat(scales, rows, axis=-2), cols, axis=-1)
        r, c = r0 - (r0 // rows) * rows, c0 - (c0 // cols) * cols
        return values * scales[..., r : r + r1 - r0, c : c + c1 - c0]
