"""Checkpoints whose linear weights are stored as 8-bit values times scales, as the loader reads them.

Two formats: block-wise FP8 (`quant_method: "fp8"`, transformers' FineGrainedFP8: DeepSeek-V3,
Qwen3-FP8) with `{weight}_scale_inv` per block of `weight_block_size`, and llm-compressor's
`"compressed-tensors"` in its 8-bit formats (`float-quantized`: FP8, `int-quantized` /
`naive-quantized`: int8) with `{weight}_scale` per tensor, output channel, group of inputs or block.
Both multiply; only symmetric weights (no zero points) are read. The settings are checked when the
config is read, so a refusal names the field before any tensor is read.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.config.model import ConfigError

COMPRESSED_FORMATS = ("float-quantized", "int-quantized", "naive-quantized")
STRATEGIES = ("tensor", "channel", "group", "block")


@dataclasses.dataclass(frozen=True)
class ScaleScheme:
    """Where a weight's scales are and what each covers.

    suffix: the scales' tensor name after the weight's ("_scale_inv", "_scale").
    block: (rows, cols) of the stored [out, in] weight one scale covers, 0 meaning the whole axis
    (a channel's scale: (1, 0)); None: one scale for the tensor.
    """

    suffix: str
    block: tuple[int, int] | None


def _positive_pair(value: Any, field: str) -> tuple[int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in value):
        raise ConfigError(f"{field} {value!r} must be two positive integers [rows, columns]")
    return int(value[0]), int(value[1])


def fp8_block_scheme(quant: Mapping[str, Any]) -> ScaleScheme:
    """A `quant_method: "fp8"` config's scheme: e4m3 values, float32 or ue8m0 scales per block (or tensor)."""
    fmt = quant.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ConfigError(f"quantization_config.fmt {fmt!r} is not supported; FP8 checkpoints are read in 'e4m3'")
    scale_fmt = quant.get("scale_fmt") or "float"
    if scale_fmt not in ("float", "ue8m0"):
        raise ConfigError(f"quantization_config.scale_fmt {scale_fmt!r} is not supported; use 'float' or 'ue8m0'")
    block = quant.get("weight_block_size")
    return ScaleScheme("_scale_inv", None if block is None else _positive_pair(
        block, "quantization_config.weight_block_size"))


def _weights_scheme(group: str, weights: Mapping[str, Any]) -> tuple[int, int] | None:
    """The block of one config group's `weights` settings (8-bit, symmetric), checked."""
    field = f"quantization_config.config_groups.{group}.weights"
    if weights.get("num_bits") != 8 or weights.get("type") not in ("float", "int"):
        raise ConfigError(f"{field}: {weights.get('num_bits')}-bit {weights.get('type')} weights are not supported; "
                          "8-bit float or int weights are")
    if weights.get("symmetric") is False:
        raise ConfigError(f"{field}.symmetric false (zero points) is not supported; symmetric weights are")
    strategy = weights.get("strategy")
    if strategy not in STRATEGIES:
        raise ConfigError(f"{field}.strategy {strategy!r} is not supported; use one of {', '.join(STRATEGIES)}")
    if strategy == "tensor":
        return None
    if strategy == "channel":
        return (1, 0)
    if strategy == "group":
        size = weights.get("group_size")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ConfigError(f"{field}.group_size {size!r} must be a positive integer for strategy 'group'")
        return (1, size)
    return _positive_pair(weights.get("block_structure"), f"{field}.block_structure")


def compressed_scheme(quant: Mapping[str, Any]) -> ScaleScheme:
    """A `quant_method: "compressed-tensors"` config's scheme (one for every group of weights), checked."""
    fmt = quant.get("format")
    if fmt not in COMPRESSED_FORMATS:
        raise ConfigError(f"quantization_config.format {fmt!r} is not supported; compressed-tensors checkpoints are "
                          f"read in {', '.join(COMPRESSED_FORMATS)} (8-bit weights) and pack-quantized (4- or 8-bit "
                          "integers)")
    groups = quant.get("config_groups") or {}
    blocks = {_weights_scheme(name, group.get("weights") or {}) for name, group in groups.items()}
    if len(blocks) != 1:
        raise ConfigError(f"quantization_config.config_groups must give every group of weights one scheme; got "
                          f"{len(blocks)} ({sorted(groups)})")
    return ScaleScheme("_scale", blocks.pop())


def scale_scheme(quant: Mapping[str, Any] | None) -> ScaleScheme | None:
    """The scheme of a checkpoint's `quantization_config` (None: not one of these formats)."""
    method = (quant or {}).get("quant_method")
    if method == "fp8":
        return fp8_block_scheme(quant)
    if method == "compressed-tensors" and quant.get("format") != "pack-quantized":  # packed: `packed_checkpoint`
        return compressed_scheme(quant)
    return None
