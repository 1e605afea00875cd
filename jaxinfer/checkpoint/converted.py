"""Converted checkpoints (`jaxinfer convert`, `save_converted`): an orbax checkpoint of the weight tree beside
the model's config and tokenizer files, quantized leaves as stored, restored into any layout."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.checkpoint.leaf_paths import leaf_paths, unflatten
from jaxinfer.config.errors import CheckpointError
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, abstract_weights, load_config, projections
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import UNSHARDED, Layout
from jaxinfer.quantization.quantized_experts import QuantizedExperts
from jaxinfer.quantization.quantized_weight import QuantizedWeight

ORBAX_SUBDIR = "jaxinfer_weights"
# config.json of a quantized convert: {"mode": projections' or null, "group_size": ..., "experts": the routed
# experts' {"mode", "group_size"} or null}
QUANT_KEY = "jaxinfer_quantization"
QUANT_SUFFIXES = (".values", ".scales")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
    "chat_template.jinja",
)
CONVERTED_FILES = ("config.json", ORBAX_SUBDIR, *TOKENIZER_FILES)  # everything save_converted writes


def stored_dtype(weights: Weights, cfg: ModelConfig) -> str:
    """The one dtype name of every unquantized leaf without a dtype of its own ("bfloat16", ...); mixed trees
    are an error."""
    own = {path for path, info in leaf_paths(abstract_weights(cfg)) if info.dtype}
    names = {jnp.dtype(leaf.dtype).name for p, leaf in leaf_paths(weights)
             if not p.endswith(QUANT_SUFFIXES) and p not in own}
    if len(names) != 1:
        raise CheckpointError(f"weights mix dtypes {sorted(names)}; convert stores one dtype")
    return names.pop()


def check_out_dir(out_dir: Path, overwrite: bool, field: str = "out_dir", flag: str = "overwrite=True") -> None:
    """Refuse a file, and a non-empty directory unless `overwrite`: a converted model must not mix with other files."""
    if out_dir.exists() and not out_dir.is_dir():
        raise CheckpointError(f"{field} {out_dir} is a file; give a directory to write the converted model into")
    if not overwrite and out_dir.is_dir() and any(out_dir.iterdir()):
        raise CheckpointError(f"{field} {out_dir} is not empty; give a new or empty directory, or pass {flag} to "
                              f"replace what a convert writes there ({', '.join(CONVERTED_FILES[:2])}, ...)")


def _remove_converted(out: Path) -> None:
    """Delete what an earlier convert wrote, so no file of another model (a tokenizer, generation defaults) stays."""
    for name in CONVERTED_FILES:
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def save_converted(weights: Weights, src_dir: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write weights as an orbax checkpoint next to config and tokenizer files copied from src_dir.

    The written config.json states the stored dtype, so `dtype="auto"` restores what was saved.
    out_dir must be new or empty unless `overwrite`, which replaces what a convert writes there.
    """
    from orbax import checkpoint as ocp

    src, out = Path(src_dir).absolute(), Path(out_dir).absolute()
    if isinstance(weights.lm_head, QuantizedWeight):
        raise ValueError("these weights have a quantized output head (quantize_lm_head=True), which converted "
                         "checkpoints do not store; convert the model without it and pass quantize_lm_head at load")
    if src.resolve() == out.resolve():
        raise ValueError(f"out_dir {out} is src_dir itself; write the converted model to another directory")
    if (path := _checkpoint_levels(weights)) is not None:
        raise ValueError(f"{path} holds a 4-bit checkpoint's own levels (fp16 scales or zero levels), which converted "
                         "checkpoints do not store; run the HF directory as it is, or `jaxinfer convert` it (its "
                         "weights dequantized, or quantized again with --quantize)")
    check_out_dir(out, overwrite)
    _remove_converted(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    config = json.loads((src / "config.json").read_text())
    _set_dtype(config, stored_dtype(weights, load_config(src)))
    config.pop(QUANT_KEY, None)
    quant, experts = quantization_of(weights), experts_quantization(weights)
    if quant is not None or experts is not None:
        mode, group = quant or (None, 0)
        config[QUANT_KEY] = {"mode": mode, "group_size": group, "experts": experts}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(out / ORBAX_SUBDIR, dict(leaf_paths(weights)))
    return out


def _checkpoint_levels(weights: Weights) -> str | None:
    """The first leaf holding an AWQ/GPTQ/compressed-tensors checkpoint's int4 levels in a layout jaxinfer's own
    int4 does not have (zero levels, non-bf16 scales, act order's input order), else None."""
    for i, lw in enumerate(weights.layers):
        for name, leaf in vars(lw).items():
            if not isinstance(leaf, (QuantizedWeight, QuantizedExperts)) or leaf.mode != "int4":
                continue
            if leaf.zeros is not None or getattr(leaf, "perm", None) is not None or leaf.scales.dtype != jnp.bfloat16:
                return f"layers.{i}.{name}"
    return None


def quantization_of(weights: Weights) -> tuple[str, int] | None:
    """(mode, group) of a tree whose projections are quantized, else None (read from the first quantized
    projection: a hybrid's layer 0 may keep a state and have no wq)."""
    for lw in weights.layers:
        for leaf in vars(lw).values():
            if isinstance(leaf, QuantizedWeight):
                return leaf.mode, leaf.group
    return None


def experts_quantization(weights: Weights) -> dict[str, Any] | None:
    """{"mode", "group_size"} of a tree's quantized routed experts, else None."""
    for lw in weights.layers:
        for leaf in vars(lw).values():
            if isinstance(leaf, QuantizedExperts):
                return {"mode": leaf.mode, "group_size": leaf.group}
    return None


def _stored_experts(quant: dict[str, Any]) -> dict[str, Any] | None:
    """The experts' entry of a convert's QUANT_KEY: a dict, or (converts of 2026-11-29) True for the projections'
    mode; absent or false (earlier converts): float experts."""
    experts = quant.get("experts")
    if experts is True:
        return {"mode": quant["mode"], "group_size": quant["group_size"] if quant["mode"] == "int4" else 0}
    return experts or None


def quantized_abstract(abstract: Weights, mode: str | None, group: int,
                       experts: dict[str, Any] | None = None) -> Weights:
    """The abstract tree with each projection a QuantizedWeight (where `mode`) and each layer's routed experts
    a QuantizedExperts (where `experts`: {"mode", "group_size"}), placeholder values/scales, real statics."""
    placeholder = ArrayInfo((), ())

    def layer(lw):
        fields = {} if mode is None else {
            name: QuantizedWeight(placeholder, placeholder, getattr(lw, name).shape, c, mode, group)
            for name, c in projections(lw).items()}
        if experts is not None:
            fields.update({name: QuantizedExperts(placeholder, placeholder, experts["mode"], experts["group_size"])
                           for name in getattr(type(lw), "EXPERTS", ()) if getattr(lw, name) is not None})
        return dataclasses.replace(lw, **fields)

    return dataclasses.replace(abstract, layers=[layer(lw) for lw in abstract.layers])


def _set_dtype(config: dict, dtype: str) -> None:
    """Record `dtype` under the key(s) the config uses: "dtype" (transformers 5), "torch_dtype" (4)."""
    keys = [k for k in ("dtype", "torch_dtype") if k in config] or ["dtype"]
    for key in keys:
        config[key] = dtype


def restore_converted(model_dir: str | Path, cfg: ModelConfig, dtype: Any, layout: Layout = UNSHARDED) -> Weights:
    """Read weights written by `save_converted`, cast to `dtype` (quantized values and scales as stored, leaves
    with a dtype of their own in theirs).

    With a mesh each leaf is restored straight into its sharding (orbax reads the slices each
    device holds), whatever mesh the checkpoint was saved from.
    """
    from orbax import checkpoint as ocp

    abstract = abstract_weights(cfg)
    quant = json.loads((Path(model_dir) / "config.json").read_text()).get(QUANT_KEY)
    if quant is not None:
        abstract = quantized_abstract(abstract, quant["mode"], quant["group_size"], _stored_experts(quant))
    path = Path(model_dir).absolute() / ORBAX_SUBDIR
    with ocp.StandardCheckpointer() as ckpt:
        meta = ckpt.metadata(path)
        tree = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta
        infos = dict(leaf_paths(abstract))
        target = {p: _restore_target(p, info, tree[p], layout) for p, info in infos.items()}
        restored = ckpt.restore(path, target)
    return unflatten(abstract, {p: v if p.endswith(QUANT_SUFFIXES) else v.astype(infos[p].dtype_in(dtype))
                                 for p, v in restored.items()})


def _restore_target(path: str, info: Any, stored: Any, layout: Layout) -> jax.ShapeDtypeStruct:
    """What orbax restores one leaf as: its shape and stored dtype, in its sharding (quantized leaves whole)."""
    if path.endswith(QUANT_SUFFIXES):
        return jax.ShapeDtypeStruct(stored.shape, stored.dtype, sharding=layout.sharding(stored.shape, ()))
    return jax.ShapeDtypeStruct(info.shape, stored.dtype, sharding=layout.sharding(info.shape, info.axes))


def is_converted(model_dir: str | Path) -> bool:
    """True for a directory written by `jaxinfer convert`."""
    return (Path(model_dir) / ORBAX_SUBDIR).is_dir()
