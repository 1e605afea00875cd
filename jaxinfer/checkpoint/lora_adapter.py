"""PEFT LoRA adapters read into per-projection factors, checked against the model they adapt.

A PEFT directory holds adapter_config.json (r, lora_alpha, target_modules, ...) and
adapter_model.safetensors with `base_model.model.<module>.lora_A.weight` [r, in] and
`lora_B.weight` [out, r] per adapted torch Linear. The module names are the base checkpoint's
(the family's `hf_leaves`), so each maps to the projection fields it feeds: one field, or two
or three where the checkpoint fuses them (Phi-3's qkv_proj and gate_up_proj, split by rows).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from safetensors import SafetensorError, safe_open

from jaxinfer.config.errors import CheckpointError
from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.model import ModelConfig
from jaxinfer.models.registry import family_of

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."
FACTORS = (".lora_A.weight", ".lora_B.weight")


class FieldPart(NamedTuple):
    """Where one projection field sits in a checkpoint module's output rows."""

    layer: int
    field: str
    row_offset: int
    rows: int
    in_size: int


class Adapter(NamedTuple):
    """An adapter's factors per (layer, field): a [K, r] and b [r, N] as float32, its scale in b."""

    name: str
    path: Path
    rank: int
    factors: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]


def module_parts(cfg: ModelConfig) -> dict[str, list[FieldPart]]:
    """Each adaptable checkpoint module (e.g. model.layers.3.self_attn.q_proj) -> the fields it feeds."""
    family = family_of(cfg)
    leaves = family.hf_leaves(cfg)
    parts: dict[str, list[FieldPart]] = {}
    for i in range(cfg.num_layers):
        abstract = family.abstract_layer(cfg, i)
        for name, contract in type(abstract).PROJECTIONS.items():
            leaf, info = leaves.get(name), getattr(abstract, name)
            if leaf is None or info is None or leaf.experts or not leaf.name.endswith(".weight"):
                continue
            module = leaf.name.format(i=i)[: -len(".weight")]
            in_size, rows = math.prod(info.shape[:contract]), math.prod(info.shape[contract:])
            parts.setdefault(module, []).append(FieldPart(i, name, leaf.row_offset, rows, in_size))
    return parts


def read_adapter(request: LoRARequest, cfg: ModelConfig, max_rank: int) -> Adapter:
    """The adapter's factors for this model; CheckpointError naming the file, field and value when it does not fit."""
    path = Path(request.lora_path).expanduser()
    settings = _settings(path)
    rank = int(settings.get("r") or 0)
    if not 1 <= rank <= max_rank:
        raise CheckpointError(f"LoRA adapter {request.lora_name!r} ({path}) has rank r={rank}; this engine takes "
                              f"ranks 1..{max_rank} (raise max_lora_rank to serve it)")
    scale = float(settings.get("lora_alpha", rank)) / (math.sqrt(rank) if settings.get("use_rslora") else rank)
    tensors = _tensors(path / WEIGHTS_FILE)
    parts = module_parts(cfg)
    factors: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
    for module in sorted({name[: -len(FACTORS[0])] for name in tensors if name.endswith(FACTORS[0])}):
        fields = parts.get(module.removeprefix(PREFIX))
        if fields is None:
            adaptable = sorted({m.rsplit(".", 1)[-1] for m in parts})
            raise CheckpointError(f"LoRA adapter {request.lora_name!r} ({path}) adapts "
                                  f"{module.removeprefix(PREFIX)!r}, which this {cfg.architecture} does not serve "
                                  f"with adapters; adaptable modules: {', '.join(adaptable)}")
        a, b = tensors[module + FACTORS[0]], tensors.get(module + FACTORS[1])
        _check_factors(request, module, a, b, rank, fields)
        for part in fields:
            rows = b[part.row_offset : part.row_offset + part.rows]
            factors[(part.layer, part.field)] = (a.T.copy(), (rows.T * scale).astype(np.float32))
    return Adapter(request.lora_name, path, rank, factors)


def adapter_rank(path: str | Path) -> int:
    """The rank a PEFT directory's adapter_config.json states (its settings checked as `read_adapter` does)."""
    return int(_settings(Path(path).expanduser()).get("r") or 0)


def _settings(path: Path) -> dict[str, Any]:
    """adapter_config.json, checked for what this reader serves: plain LoRA on Linear layers."""
    file = path / CONFIG_FILE
    try:
        settings = json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{file} does not exist; a LoRA adapter is a PEFT directory with {CONFIG_FILE} and "
                              f"{WEIGHTS_FILE}") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{file} cannot be read as JSON ({err})") from None
    served = {  # field -> (whether the adapter's value is served, what is)
        "peft_type": (settings.get("peft_type", "LORA") == "LORA", "'LORA'"),
        "use_dora": (not settings.get("use_dora"), "false (DoRA's magnitudes are not served)"),
        "bias": ((settings.get("bias") or "none") == "none", "'none'"),
        "fan_in_fan_out": (not settings.get("fan_in_fan_out"), "false (GPT-2's Conv1D layers)"),
        "modules_to_save": (not settings.get("modules_to_save"), "empty (whole trained modules are not served)"),
        "rank_pattern": (not settings.get("rank_pattern"), "empty (one rank for every module)"),
        "alpha_pattern": (not settings.get("alpha_pattern"), "empty (one lora_alpha for every module)"),
    }
    for field, (ok, accepted) in served.items():
        if not ok:
            raise CheckpointError(f"{file}: {field}={settings.get(field)!r} is not served; LoRA adapters are served "
                                  f"with {field} {accepted}")
    return settings


def _tensors(file: Path) -> dict[str, np.ndarray]:
    """Every tensor of the adapter's safetensors file as float32 NumPy."""
    try:
        with safe_open(str(file), framework="numpy") as st:
            return {name: st.get_tensor(name).astype(np.float32) for name in st.keys()}
    except FileNotFoundError:
        raise CheckpointError(f"{file} does not exist; a LoRA adapter's weights are in {WEIGHTS_FILE}") from None
    except (SafetensorError, OSError, TypeError) as err:
        raise CheckpointError(f"{file} cannot be read ({' '.join(str(err).split())}); expected a safetensors "
                              "file (bf16 adapters: save them as float32 or float16)") from None


def _check_factors(request: LoRARequest, module: str, a: np.ndarray, b: np.ndarray | None, rank: int,
                   fields: list[FieldPart]) -> None:
    out_rows = max(p.row_offset + p.rows for p in fields)
    want_a, want_b = (rank, fields[0].in_size), (out_rows, rank)
    if b is None or a.shape != want_a or b.shape != want_b:
        got = f"lora_A {a.shape}, lora_B {None if b is None else b.shape}"
        raise CheckpointError(f"LoRA adapter {request.lora_name!r}: {module} has {got}; this model needs lora_A "
                              f"{want_a} and lora_B {want_b} (was it trained for another model?)")
