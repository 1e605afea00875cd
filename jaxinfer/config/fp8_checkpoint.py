"""The settings of a block-wise FP8 checkpoint (`quantization_config.quant_method: "fp8"`) the loader reads."""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError


def block_size(quant: Mapping[str, Any]) -> tuple[int, int] | None:
    """The [rows, cols] of a `quant_method: "fp8"` config's scale blocks (None: one scale per tensor),
    after checking the settings the reader takes (e4m3 values; float32 or ue8m0 scales)."""
    fmt = quant.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ConfigError(f"quantization_config.fmt {fmt!r} is not supported; FP8 checkpoints are read in 'e4m3'")
    scale_fmt = quant.get("scale_fmt") or "float"
    if scale_fmt not in ("float", "ue8m0"):
        raise ConfigError(f"quantization_config.scale_fmt {scale_fmt!r} is not supported; use 'float' or 'ue8m0'")
    block = quant.get("weight_block_size")
    if block is None:
        return None
    if len(block) != 2 or not all(isinstance(n, int) and n > 0 for n in block):
        raise ConfigError(f"quantization_config.weight_block_size {block!r} must be two positive integers "
                          "[rows, columns] (or null for one scale per tensor)")
    return int(block[0]), int(block[1])
