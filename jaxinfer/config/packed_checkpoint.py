"""Checkpoints whose linear weights are packed low-bit integers with per-group scales and zero points.

The three formats most 4-bit models on the HF hub come in (the tensors' layout: `checkpoint.int4_packing`):

- AWQ (`quant_method: "awq"`, AutoAWQ's `version: "gemm"`): 4-bit, asymmetric (`zero_point: true`),
  one fp16 scale and zero point per output and group of `group_size` inputs;
- GPTQ (`"gptq"`, AutoGPTQ / GPTQModel): 4- or 8-bit, `sym` or not, `desc_act` (act order: each input's
  group read from `g_idx`), zero points stored minus one unless `checkpoint_format: "gptq_v2"`;
- compressed-tensors `format: "pack-quantized"` (llm-compressor's W4A16 and W8A16, `_ASYM` too): integer
  weights per group or channel, zero points only where not `symmetric`.

The settings are checked when the config is read, so a refusal names the field before any tensor is read.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.config.model import ConfigError

PACKED_METHODS = ("awq", "gptq", "compressed-tensors")
GPTQ_FORMATS = ("gptq", "gptq_v2")


@dataclasses.dataclass(frozen=True)
class PackedScheme:
    """How a checkpoint's packed weights read.

    method: "awq", "gptq" or "compressed-tensors" (the tensors' names and packing order).
    bits: bits a value (4, or 8 for GPTQ and compressed-tensors).
    group: inputs sharing one scale and zero point; 0: all of them (one per output channel).
    symmetric: no zero points stored; every group's zero level is 2 ** (bits - 1).
    zero_offset: added to each stored zero point (GPTQ's v1 format stores them minus one).
    """

    method: str
    bits: int
    group: int
    symmetric: bool
    zero_offset: int = 0


def _int_field(quant: Mapping[str, Any], key: str, field: str, accepted: tuple[int, ...]) -> int:
    value = quant.get(key)
    if value not in accepted or isinstance(value, bool):
        raise ConfigError(f"{field} {value!r} is not supported; use one of {', '.join(map(str, accepted))}")
    return int(value)


def _group_size(value: Any, field: str) -> int:
    """A group size: a positive integer, or -1 (GPTQ's and AWQ's whole-input groups) as 0."""
    if isinstance(value, bool) or not isinstance(value, int) or (value <= 0 and value != -1):
        raise ConfigError(f"{field} {value!r} must be a positive integer or -1 (one group over all inputs)")
    return max(value, 0)


def awq_scheme(quant: Mapping[str, Any]) -> PackedScheme:
    """An AutoAWQ GEMM checkpoint's scheme, checked."""
    version = str(quant.get("version", "gemm")).lower()
    if version != "gemm":
        raise ConfigError(f"quantization_config.version {quant.get('version')!r} is not supported; AWQ checkpoints "
                          "are read in AutoAWQ's 'gemm' packing (GEMV, GEMV-fast, Marlin and exllama variants are not)")
    backend = quant.get("backend", "autoawq")
    if backend not in ("autoawq", None):
        raise ConfigError(f"quantization_config.backend {backend!r} is not supported; AWQ checkpoints are read as "
                          "'autoawq' packs them")
    bits = _int_field(quant, "bits" if "bits" in quant else "w_bit", "quantization_config.bits", (4,))
    if quant.get("zero_point", True) is not True:
        raise ConfigError(f"quantization_config.zero_point {quant.get('zero_point')!r} is not supported; AutoAWQ's "
                          "GEMM checkpoints store zero points (zero_point: true)")
    size = quant.get("group_size", quant.get("q_group_size", 128))
    return PackedScheme("awq", bits, _group_size(size, "quantization_config.group_size"), symmetric=False)


def gptq_scheme(quant: Mapping[str, Any]) -> PackedScheme:
    """A GPTQ checkpoint's scheme, checked (bits 2 and 3 and the Marlin/BitBLAS re-packings are refused)."""
    fmt = quant.get("checkpoint_format", "gptq")
    if fmt not in GPTQ_FORMATS or quant.get("is_marlin_format"):
        raise ConfigError(f"quantization_config.checkpoint_format {fmt!r} is not supported; GPTQ checkpoints are "
                          f"read in {' or '.join(map(repr, GPTQ_FORMATS))} (not Marlin, BitBLAS or other repackings)")
    bits = _int_field(quant, "bits", "quantization_config.bits", (4, 8))
    if quant.get("pack_dtype", "int32") not in ("int32", "torch.int32"):  # GPTQModel can pack into other words
        raise ConfigError(f"quantization_config.pack_dtype {quant.get('pack_dtype')!r} is not supported; GPTQ "
                          "checkpoints are read packed into int32 words")
    group = _group_size(quant.get("group_size", 128), "quantization_config.group_size")
    return PackedScheme("gptq", bits, group, symmetric=False, zero_offset=1 if fmt == "gptq" else 0)


def compressed_packed_scheme(quant: Mapping[str, Any]) -> PackedScheme:
    """A compressed-tensors `pack-quantized` checkpoint's scheme (one for every group of weights), checked."""
    groups = quant.get("config_groups") or {}
    schemes = {_pack_group(name, group.get("weights") or {}) for name, group in groups.items()}
    if len(schemes) != 1:
        raise ConfigError(f"quantization_config.config_groups must give every group of weights one scheme; got "
                          f"{len(schemes)} ({sorted(groups)})")
    return schemes.pop()


def _pack_group(name: str, weights: Mapping[str, Any]) -> PackedScheme:
    """One config group's `weights` settings as a scheme: integer weights packed per group or channel."""
    field = f"quantization_config.config_groups.{name}.weights"
    if weights.get("num_bits") not in (4, 8) or weights.get("type") != "int":
        raise ConfigError(f"{field}: {weights.get('num_bits')}-bit {weights.get('type')} weights are not supported "
                          "in pack-quantized; 4- or 8-bit int weights are")
    strategy = weights.get("strategy")
    if strategy not in ("group", "channel"):
        raise ConfigError(f"{field}.strategy {strategy!r} is not supported in pack-quantized; use 'group' or 'channel'")
    group = 0 if strategy == "channel" else _group_size(weights.get("group_size"), f"{field}.group_size")
    return PackedScheme("compressed-tensors", int(weights["num_bits"]), group,
                        symmetric=weights.get("symmetric", True) is not False)


def packed_scheme(quant: Mapping[str, Any] | None) -> PackedScheme | None:
    """The scheme of a checkpoint's `quantization_config` (None: not a packed-integer format)."""
    method = (quant or {}).get("quant_method")
    if method == "awq":
        return awq_scheme(quant)
    if method == "gptq":
        return gptq_scheme(quant)
    if method == "compressed-tensors" and quant.get("format") == "pack-quantized":
        return compressed_packed_scheme(quant)
    return None
