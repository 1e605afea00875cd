"""Checkpoints: HF safetensors -> weight pytree, and orbax save/restore of converted models."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm

from jaxinfer.checkpoint import base_model_names, scaled_weights
from jaxinfer.checkpoint.hf_names import HFTensor, expected_hf_names, hf_tensor_map, in_mtp_layer, stored_names
from jaxinfer.checkpoint.mxfp4 import Mxfp4Slice, packed_names
from jaxinfer.config.errors import CheckpointError
from jaxinfer.config.model import ModelConfig, read_config_json
from jaxinfer.config.scaled_checkpoint import scale_scheme
from jaxinfer.models import Weights, abstract_weights, load_config, projections
from jaxinfer.parallel.array_info import ArrayInfo, is_info
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
# Buffers some exporters write that are derived, not learned.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
PROGRESS_MIN_BYTES = 256 * 2**20
LeafTransform = Callable[[str, jax.Array], Any]  # (dotted leaf path, leaf as read) -> what the tree holds


def leaf_paths(tree: Any) -> Iterator[tuple[str, Any]]:
    """(dotted path, leaf) pairs of a weights tree: 'embed', 'layers.3.wq', ..."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_info)
    for path, leaf in flat:
        yield ".".join(_key_name(k) for k in path), leaf


def _key_name(key: Any) -> str:
    for attr in ("name", "idx", "key"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def hf_source(path: str, tensors: dict[str, HFTensor]) -> tuple[HFTensor, list[str]]:
    """The HF tensor description and stored tensor names (one per expert for stacked leaves)
    behind a leaf path like 'layers.3.wq'."""
    parts = path.split(".")
    if parts[0] == "layers":
        t = tensors[f"layers.{parts[2]}"]
        return t, stored_names(t, int(parts[1]))
    return tensors[path], stored_names(tensors[path], None)


def layer_fields(abstract: Weights) -> list[list[str]]:
    """Each layer's leaf field names (fields a layer does not have are None in the abstract tree)."""
    return [[f.name for f in dataclasses.fields(lw) if getattr(lw, f.name) is not None] for lw in abstract.layers]


def open_safetensors(path: Path) -> Any:
    """A safetensors file opened for reading; CheckpointError naming it when it is missing, cut short or not one."""
    try:
        return safe_open(path, "numpy")
    except (SafetensorError, OSError) as err:
        raise CheckpointError(
            f"{path} cannot be read ({' '.join(str(err).split())}); expected a complete safetensors file: "
            "download or save it again"
        ) from None


def _index_weight_map(index: Path) -> dict[str, str]:
    """The tensor name -> file name map of a sharded checkpoint's index; CheckpointError naming it if unreadable."""
    try:
        raw = json.loads(index.read_text())
    except ValueError as err:
        raise CheckpointError(f"{index} is not valid JSON ({err}); expected an HF safetensors index") from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(
            f"{index} has no weight_map object (tensor name -> file); expected an HF safetensors index"
        )
    return weight_map


def safetensors_index(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (sharded index or single/multiple files)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = {name: model_dir / fname for name, fname in _index_weight_map(index).items()}
        absent = sorted({f.name for f in files.values() if not f.is_file()})
        if absent:
            raise CheckpointError(f"{index} lists {len(absent)} file(s) not in {model_dir} (first: {absent[0]}); "
                                  "expected every shard it names beside it: download them too")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"no *.safetensors in {model_dir}; jaxinfer reads HF safetensors checkpoints "
            "(re-save PyTorch .bin checkpoints with save_pretrained(safe_serialization=True))"
        )
    out: dict[str, Path] = {}
    for f in files:
        with open_safetensors(f) as st:
            out.update({name: f for name in st.keys()})
    return out


def _check_names(cfg: ModelConfig, index: dict[str, Path], model_dir: Path) -> None:
    """Fail on missing or unexpected tensors, naming them and where they were looked for."""
    expected = expected_hf_names(cfg, layer_fields(abstract_weights(cfg)))
    packed = packed_names(index)
    found = {n for n in index if not n.endswith(IGNORED_SUFFIXES) and not in_mtp_layer(cfg, n)
             and not scaled_weights.is_activation_scale(n)}
    found -= {n for pair in packed.values() for n in pair}
    if (scheme := scale_scheme(read_config_json(model_dir).get("quantization_config"))) is not None:
        found -= set(scaled_weights.packed_names(index, scheme.suffix).values())  # a weight's scales: read with it
    found |= set(packed)
    if cfg.tie_word_embeddings:
        found.discard("lm_head.weight")  # some exporters keep the tied copy
    missing = sorted(expected - found)
    if missing:
        raise CheckpointError(
            f"checkpoint {model_dir} is missing {len(missing)} tensor(s), first: {missing[:5]}"
        )
    unexpected = sorted(found - expected)
    if unexpected:
        raise CheckpointError(
            f"checkpoint {model_dir} has {len(unexpected)} tensor(s) the config does not describe "
            f"(first: {unexpected[:5]}) in {index[packed.get(unexpected[0], (unexpected[0],))[0]].name}; "
            "is config.json for this model?"
        )


class _TensorReader:
    """Reads named tensors, keeping each safetensors file open once."""

    def __init__(self, index: dict[str, Path], quantization: dict[str, Any] | None = None):
        self._index = index
        self._packed = packed_names(index)  # MXFP4 pairs, read by their unquantized names
        self._scheme = scale_scheme(quantization)  # 8-bit weights times scales: FP8 blocks, compressed-tensors
        self._scaled = scaled_weights.packed_names(index, self._scheme.suffix) if self._scheme else {}
        self._open: dict[Path, Any] = {}

    def _slice(self, name: str) -> tuple[Any, Path]:
        if name in self._packed:
            blocks, scales = self._packed[name]
            return Mxfp4Slice(self._slice(blocks)[0], self._slice(scales)[0]), self._index[blocks]
        if name in self._scaled:
            path = self._index[name]
            if scaled_weights.stored_dtype(path, name) in scaled_weights.FP8_DTYPES:
                values = scaled_weights.Fp8Values(scaled_weights.raw_bytes(path, name))
            else:
                values = self._open_slice(name, path)
            scales = self._slice(self._scaled[name])[0]
            return scaled_weights.ScaledSlice(values, scales, self._scheme.block), path
        return self._open_slice(name, self._index[name]), self._index[name]

    def _open_slice(self, name: str, path: Path) -> Any:
        """A stored tensor as safetensors reads it."""
        if path not in self._open:
            self._open[path] = open_safetensors(path)
        return self._open[path].get_slice(name)

    def tensor(self, name: str, expected_shape: tuple[int, ...]) -> Any:
        """A lazily read tensor (index it to read a slice), after checking its shape."""
        tensor, path = self._slice(name)
        if tuple(tensor.get_shape()) != expected_shape:
            raise CheckpointError(
                f"tensor {name} in {path.name} has shape {tuple(tensor.get_shape())}, expected {expected_shape}"
            )
        return tensor


def transform_on_device() -> bool:
    """Whether one accelerator gets each tensor as stored and transposes/casts it itself.

    NumPy's transposed copy and cast run on one host thread (~1 GB/s here; an H100 machine
    took 9.7 s to load a 1B float32 checkpoint as bf16), an accelerator's in milliseconds; on
    a CPU backend the NumPy path is the faster one (SmolLM-135M float32 -> bf16: 0.8 vs 1.15 s).
    """
    return jax.default_backend() != "cpu"


def _leaf(reader: _TensorReader, t: HFTensor, names: list[str], info: ArrayInfo, dtype: Any, layout: Layout) -> jax.Array:
    """One weight leaf placed in its sharding; each device's slice is read from the file on its own.

    A stacked leaf (one stored tensor per expert) reads the experts of its slice, each as one leaf.
    """
    tensors = [reader.tensor(name, t.hf_shape) for name in names]
    if not t.experts and layout.mesh is None and transform_on_device():
        stored = tensors[0][t.hf_index(tuple(slice(0, n) for n in info.shape))]
        return t.to_jax(jax.device_put(stored)).astype(dtype)

    def read(index: tuple[slice, ...]) -> np.ndarray:
        if t.experts:  # index[0] selects experts, the rest each expert's own slice
            return np.stack([t.to_jax(x[t.hf_index(index[1:])]) for x in tensors[index[0]]]).astype(dtype)
        return t.to_jax(tensors[0][t.hf_index(index)]).astype(dtype)

    return layout.from_callback(info.shape, dtype, info.axes, read)


def load_hf_weights(
    model_dir: str | Path, cfg: ModelConfig, dtype: Any, progress: bool = True, layout: Layout = UNSHARDED,
    transform: LeafTransform | None = None,
) -> Weights:
    """Read an HF safetensors checkpoint into the weights pytree, cast to `dtype` (leaves with a dtype of their
    own to theirs), laid out by `layout`.

    transform(path, leaf): applied to each leaf as it is read (quantizing it, see
    `weight_ops.leaf_quantizer`), so no more than one leaf is ever held untransformed.
    """
    model_dir = Path(model_dir)
    index = safetensors_index(model_dir)
    stored = base_model_names.stored_names(index)  # a base model saved alone: names without "model."
    _check_names(cfg, base_model_names.by_causal_names(index), model_dir)
    reader = _TensorReader(index, read_config_json(model_dir).get("quantization_config"))
    tensors = hf_tensor_map(cfg)
    abstract = abstract_weights(cfg)
    total = sum(p.stat().st_size for p in set(index.values()))
    paths = list(leaf_paths(abstract))
    bar = tqdm(paths, desc=f"loading {model_dir.name}", disable=not progress or total < PROGRESS_MIN_BYTES)
    np_dtype = jnp.dtype(dtype)
    arrays = {}
    for path, info in bar:
        t, names = hf_source(path, tensors)
        leaf = _leaf(reader, t, [stored.get(n, n) for n in names], info, info.dtype_in(np_dtype), layout)
        arrays[path] = leaf if transform is None else transform(path, leaf)
    return _unflatten(abstract, arrays)


def _unflatten(abstract: Weights, arrays: dict[str, Any]) -> Weights:
    leaves, treedef = jax.tree.flatten(abstract, is_leaf=is_info)
    return jax.tree.unflatten(treedef, [arrays[p] for p, _ in leaf_paths(abstract)])


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


def quantization_of(weights: Weights) -> tuple[str, int] | None:
    """(mode, group) of a tree whose projections are quantized, else None."""
    first = weights.layers[0].wq
    return (first.mode, first.group) if isinstance(first, QuantizedWeight) else None


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
                           for name in getattr(type(lw), "EXPERTS", ())})
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
    return _unflatten(abstract, {p: v if p.endswith(QUANT_SUFFIXES) else v.astype(infos[p].dtype_in(dtype))
                                 for p, v in restored.items()})


def _restore_target(path: str, info: Any, stored: Any, layout: Layout) -> jax.ShapeDtypeStruct:
    """What orbax restores one leaf as: its shape and stored dtype, in its sharding (quantized leaves whole)."""
    if path.endswith(QUANT_SUFFIXES):
        return jax.ShapeDtypeStruct(stored.shape, stored.dtype, sharding=layout.sharding(stored.shape, ()))
    return jax.ShapeDtypeStruct(info.shape, stored.dtype, sharding=layout.sharding(info.shape, info.axes))


def is_converted(model_dir: str | Path) -> bool:
    """True for a directory written by `jaxinfer convert`."""
    return (Path(model_dir) / ORBAX_SUBDIR).is_dir()


def load_weights(
    model_dir: str | Path, dtype: Any, progress: bool = True, layout: Layout = UNSHARDED,
    transform: LeafTransform | None = None, cfg: ModelConfig | None = None,
) -> tuple[ModelConfig, Weights]:
    """Config and weights from an HF directory or a converted one, each leaf in its `layout` sharding.

    transform: applied to each leaf of an HF checkpoint as it is read (see `load_hf_weights`); a
    converted checkpoint is restored as it was stored. cfg: the config to read the weights by (None:
    the directory's; a pooling model's is read as tied, so no output head is asked for).
    """
    cfg = load_config(model_dir) if cfg is None else cfg
    if is_converted(model_dir):
        return cfg, restore_converted(model_dir, cfg, dtype, layout)
    return cfg, load_hf_weights(model_dir, cfg, dtype, progress, layout, transform)
