"""Packed-integer weights (AWQ, GPTQ, compressed-tensors pack-quantized) read like safetensors slices.

A packed weight is found by its values' tensor ("x.qweight", "x.weight_packed") and read under the
unquantized name ("x.weight"), so families describe the checkpoint as an unquantized one. Its views,
each [out, in] like the unquantized tensor: "weight" (the dequantized float32 values), and for keeping
the checkpoint's own levels in memory (`quantization.stored_int4`) "codes" (uint8 levels), "zeros" and
"scales" (each input's group's zero level and scale, repeated along the inputs) and "groups" (each
input's group, repeated along the outputs: GPTQ's act order).
Layers the quantizer skipped (`modules_to_not_convert`, `ignore`, the head) are stored, and read, as floats.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxinfer.checkpoint.int4_packing import COMPONENTS, Levels, levels
from jaxinfer.config.packed_checkpoint import PackedScheme

VIEWS = ("weight", "codes", "zeros", "scales", "groups")


def packed_names(names: set[str] | list[str] | dict[str, Any], scheme: PackedScheme) -> dict[str, dict[str, str]]:
    """Unquantized weight name -> {suffix: stored name} of each packed weight among a checkpoint's tensor names."""
    present = set(names)
    values, others = COMPONENTS[scheme.method]
    out = {}
    for name in present:
        if name.endswith("." + values):
            prefix = name[: -len(values)]
            out[prefix + "weight"] = {suffix: prefix + suffix for suffix in (values, *others)
                                      if prefix + suffix in present}
    return out


class PackedWeight:
    """One packed weight, its stored tensors read whole and unpacked on first use (then kept)."""

    def __init__(self, stored: dict[str, str], read: Callable[[str], np.ndarray], scheme: PackedScheme):
        self._stored, self._read, self._scheme = stored, read, scheme
        self._levels: Levels | None = None

    def levels(self) -> Levels:
        if self._levels is None:
            parts = {suffix: self._read(name) for suffix, name in self._stored.items()}
            self._levels = levels(parts, self._scheme)
        return self._levels

    def view(self, kind: str) -> "PackedView":
        """The weight's `kind` view (see VIEWS)."""
        if kind not in VIEWS:
            raise ValueError(f"packed weight view {kind!r}; use one of {VIEWS}")
        return PackedView(self, kind)


class PackedView:
    """A packed weight's view read like a safetensors slice of an [out, in] tensor."""

    def __init__(self, weight: PackedWeight, kind: str):
        self._weight, self._kind = weight, kind

    def get_shape(self) -> tuple[int, ...]:
        return tuple(self._weight.levels().codes.shape)

    @property
    def dtype(self) -> np.dtype:
        """What the view reads as: float32 weights, uint8 codes and zero levels, scales as stored."""
        if self._kind == "scales":
            return self._weight.levels().scales.dtype
        return np.dtype({"weight": np.float32, "groups": np.int32}.get(self._kind, np.uint8))

    def __getitem__(self, index: tuple[slice, ...]) -> np.ndarray:
        lv = self._weight.levels()
        rows, cols = (tuple(index) + (slice(None),) * 2)[:2]
        groups = lv.groups[cols]
        if self._kind == "codes":
            return lv.codes[rows, cols]
        if self._kind == "zeros":
            return lv.zeros[rows][:, groups].astype(np.uint8)
        if self._kind == "scales":
            return lv.scales[rows][:, groups]
        if self._kind == "groups":
            return np.broadcast_to(groups.astype(np.int32), lv.codes[rows, cols].shape)
        part = Levels(lv.codes[rows, cols], lv.zeros[rows], lv.scales[rows], groups)
        return part.dequantized()
