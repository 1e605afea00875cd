"""HF safetensors checkpoints -> the weight pytree (converted ones: `checkpoint.converted`)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm

from jaxinfer.checkpoint import base_model_names, packed_weights, scaled_weights, score_head, vision_weights
from jaxinfer.checkpoint.converted import is_converted, restore_converted
from jaxinfer.checkpoint.hf_names import (
    HFTensor,
    expected_hf_names,
    hf_tensor_map,
    layer_tensor,
    stored_names,
    unread_tensor,
)
from jaxinfer.checkpoint.leaf_paths import leaf_paths, unflatten
from jaxinfer.checkpoint.mxfp4 import Mxfp4Slice, packed_names
from jaxinfer.config.errors import CheckpointError
from jaxinfer.config.model import ModelConfig, read_config_json
from jaxinfer.config.packed_checkpoint import packed_scheme
from jaxinfer.config.scaled_checkpoint import scale_scheme
from jaxinfer.models import Weights, abstract_weights, load_config, projections
from jaxinfer.models.qwen3_5 import experts_as_stored
from jaxinfer.models.registry import family_of
from jaxinfer.models.text_part import skipped_tensors
from jaxinfer.models.vision_language import VisionLanguageConfig, VisionLanguageWeights
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import UNSHARDED, Layout
from jaxinfer.quantization import stored_int4
from jaxinfer.quantization.quantized_experts import QuantizedExperts, packed_experts_fit
from jaxinfer.quantization.quantized_weight import QuantizedWeight

log = logging.getLogger(__name__)
# Buffers some exporters write that are derived, not learned (GPT-2's and GPT-NeoX's causal masks, as older
# transformers saved them; transformers skips them too).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias", ".attention.bias",
                    ".attention.masked_bias")
# MiniMax's lightning layers' decay buffers, which transformers saves: derived from the config (models/minimax)
IGNORED_SUFFIXES += tuple(f".self_attn.{name}" for name in ("slope_rate", "query_decay", "key_decay",
                                                             "diagonal_decay"))
PROGRESS_MIN_BYTES = 256 * 2**20
LeafTransform = Callable[[str, jax.Array], Any]  # (dotted leaf path, leaf as read) -> what the tree holds


def hf_source(path: str, tensors: dict[str, HFTensor]) -> tuple[HFTensor, list[str]]:
    """The HF tensor description and stored tensor names (one per expert for stacked leaves)
    behind a leaf path like 'layers.3.wq'."""
    parts = path.split(".")
    if parts[0] == "layers":
        t = layer_tensor(tensors, int(parts[1]), parts[2])
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


def _check_names(cfg: ModelConfig, index: dict[str, Path], model_dir: Path, skipped: set[str]) -> None:
    """Fail on missing or unexpected tensors, naming them and where they were looked for (`skipped`: a vision
    tower's whose language model runs alone, not read)."""
    expected = expected_hf_names(cfg, layer_fields(abstract_weights(cfg)))
    packed = packed_names(index)
    found = {n for n in index if not n.endswith(IGNORED_SUFFIXES) and not unread_tensor(cfg, n)
             and not scaled_weights.is_activation_scale(n)}
    found -= {n for pair in packed.values() for n in pair}
    found -= skipped
    quant = read_config_json(model_dir).get("quantization_config")
    if (scheme := scale_scheme(quant)) is not None:
        found -= set(scaled_weights.packed_names(index, scheme.suffix).values())  # a weight's scales: read with it
    if (packed_int := packed_scheme(quant)) is not None:  # a packed weight's tensors read as its unquantized name
        stored_parts = packed_weights.packed_names(index, packed_int)
        found = (found - {n for parts in stored_parts.values() for n in parts.values()}) | set(stored_parts)
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
        self.packed_scheme = packed_scheme(quantization)  # AWQ, GPTQ, compressed-tensors pack-quantized
        self._packed_int = packed_weights.packed_names(index, self.packed_scheme) if self.packed_scheme else {}
        self._open: dict[Path, Any] = {}

    def packed(self, name: str, expected_shape: tuple[int, ...]) -> packed_weights.PackedWeight | None:
        """A packed-integer weight by its unquantized name, its shape checked (None: not stored packed)."""
        if name not in self._packed_int:
            return None
        parts = self._packed_int[name]
        weight = packed_weights.PackedWeight(parts, self._whole, self.packed_scheme)
        self._check_shape(name, weight.view("weight"), self._index[next(iter(parts.values()))], expected_shape)
        return weight

    def _whole(self, name: str) -> np.ndarray:
        return scaled_weights.whole(self._open_slice(name, self._index[name]))

    def _slice(self, name: str) -> tuple[Any, Path]:
        if name in self._packed:
            blocks, scales = self._packed[name]
            return Mxfp4Slice(self._slice(blocks)[0], self._slice(scales)[0]), self._index[blocks]
        if name in self._packed_int:
            parts = self._packed_int[name]
            weight = packed_weights.PackedWeight(parts, self._whole, self.packed_scheme)
            return weight.view("weight"), self._index[next(iter(parts.values()))]
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
        self._check_shape(name, tensor, path, expected_shape)
        return tensor

    @staticmethod
    def _check_shape(name: str, tensor: Any, path: Path, expected_shape: tuple[int, ...]) -> None:
        if tuple(tensor.get_shape()) != expected_shape:
            raise CheckpointError(
                f"tensor {name} in {path.name} has shape {tuple(tensor.get_shape())}, expected {expected_shape}"
            )


def transform_on_device() -> bool:
    """Whether one accelerator gets each tensor as stored and transposes/casts it itself.

    NumPy's transposed copy and cast run on one host thread (~1 GB/s here; an H100 machine
    took 9.7 s to load a 1B float32 checkpoint as bf16), an accelerator's in milliseconds; on
    a CPU backend the NumPy path is the faster one (SmolLM-135M float32 -> bf16: 0.8 vs 1.15 s).
    """
    return jax.default_backend() != "cpu"


def _leaf(tensors: list[Any], t: HFTensor, info: ArrayInfo, dtype: Any, layout: Layout) -> jax.Array:
    """One weight leaf placed in its sharding from its stored tensors (slice-like, one per expert for a stacked
    leaf); each device's slice is read from the file on its own, a stacked leaf's experts each as one leaf.
    """
    if not t.experts and layout.mesh is None and transform_on_device():
        stored = tensors[0][t.hf_index(tuple(slice(0, n) for n in info.shape))]
        return t.to_jax(jax.device_put(stored)).astype(dtype)

    def read(index: tuple[slice, ...]) -> np.ndarray:
        if t.experts:  # index[0] selects experts, the rest each expert's own slice
            return np.stack([t.to_jax(x[t.hf_index(index[1:])]) for x in tensors[index[0]]]).astype(dtype)
        return t.to_jax(tensors[0][t.hf_index(index)]).astype(dtype)

    return layout.from_callback(info.shape, dtype, info.axes, read)


def load_named_leaves(
    model_dir: Path, sources: dict[str, tuple[HFTensor, list[str], ArrayInfo]], dtype: Any, layout: Layout = UNSHARDED,
) -> dict[str, jax.Array]:
    """Leaves outside the decoder's tree (a model's MTP layer), by path: (HF tensor, stored names, ArrayInfo), each
    read as `load_hf_weights` reads its own (FP8 blocks and MXFP4 dequantized), cast and laid out."""
    reader = _TensorReader(safetensors_index(model_dir), read_config_json(model_dir).get("quantization_config"))
    np_dtype = jnp.dtype(dtype)
    return {path: _leaf([reader.tensor(name, t.hf_shape) for name in names], t, info, info.dtype_in(np_dtype), layout)
            for path, (t, names, info) in sources.items()}


def load_hf_weights(
    model_dir: str | Path, cfg: ModelConfig, dtype: Any, progress: bool = True, layout: Layout = UNSHARDED,
    transform: LeafTransform | None = None, keep_int4: bool = False,
) -> Weights:
    """Read an HF safetensors checkpoint into the weights pytree, cast to `dtype` (leaves with a dtype of their
    own to theirs), laid out by `layout`.

    keep_int4: projections stored packed in 4 bits (AWQ, GPTQ, compressed-tensors) load as int4 leaves of the
    checkpoint's own levels instead (`transform` then skips them); other packed weights load dequantized.

    transform(path, leaf): applied to each leaf as it is read (quantizing it, see
    `weight_ops.leaf_quantizer`), so no more than one leaf is ever held untransformed.
    """
    model_dir = Path(model_dir)
    index = score_head.decoder_index(read_config_json(model_dir), safetensors_index(model_dir))  # head: read apart
    # A base model saved alone (names without "model."), or a vision-language model's language model
    skipped = skipped_tensors(cfg.architecture, index)  # counted in one log line before any renaming drops them
    stored = (base_model_names.stored_names(index, family_of(cfg).top_names[0])
              or vision_weights.language_model_names(index) or family_of(cfg).stored_names(index))
    cfg = experts_as_stored(cfg, stored or index)  # Qwen3.5-MoE's experts: fused (the hub's) or one per expert
    _check_names(cfg, {name: index[s] for name, s in stored.items()} if stored else index, model_dir, skipped)
    reader = _TensorReader(index, read_config_json(model_dir).get("quantization_config"))
    tensors = hf_tensor_map(cfg)
    abstract = abstract_weights(cfg)
    total = sum(p.stat().st_size for p in set(index.values()))
    paths = list(leaf_paths(abstract))
    bar = tqdm(paths, desc=f"loading {model_dir.name}", disable=not progress or total < PROGRESS_MIN_BYTES)
    np_dtype = jnp.dtype(dtype)
    arrays = {}
    contracts = {f"layers.{i}.{name}": c for i, lw in enumerate(abstract.layers) for name, c in projections(lw).items()}
    contracts |= {f"layers.{i}.{name}": None for i, lw in enumerate(abstract.layers)  # routed experts
                  for name in getattr(type(lw), "EXPERTS", ())}
    for path, info in bar:
        t, names = hf_source(path, tensors)
        names = [stored.get(n, n) for n in names]
        kept = _int4_leaf(reader, t, names, info, layout, contracts[path]) if keep_int4 and path in contracts else None
        if kept is not None:
            arrays[path] = kept
            continue
        leaf = _leaf([reader.tensor(name, t.hf_shape) for name in names], t, info, info.dtype_in(np_dtype), layout)
        arrays[path] = leaf if transform is None else transform(path, leaf)
    return unflatten(abstract, arrays)


def _int4_leaf(reader: _TensorReader, t: HFTensor, names: list[str], info: ArrayInfo, layout: Layout,
               contract: int | None) -> QuantizedWeight | QuantizedExperts | None:
    """A projection (contract: its input axes) or routed experts (None: one stored tensor per expert) stored
    packed in 4 bits as an int4 leaf of the checkpoint's own levels (`stored_int4`); None where they are not, or
    their groups are not runs of inputs (GPTQ's act order: kept in its input order on one device, not on a mesh
    nor for experts) or would be cut by a tp split: read dequantized."""
    scheme = reader.packed_scheme
    if scheme is None or scheme.bits != 4 or (contract is None) != bool(t.experts) or (t.experts and len(names) < 2):
        return None
    weights = [reader.packed(name, t.hf_shape) for name in names]
    if any(w is None for w in weights):
        return None
    if contract is None and not packed_experts_fit(info.shape, info.axes, layout, scheme.group or info.shape[1]):
        log.info("%s: 4-bit groups a tp split would cut, so the experts load dequantized", path_of(names))
        return None
    arrays = {kind: _leaf([w.view(kind) for w in weights], t, info, weights[0].view(kind).dtype, layout)
              for kind in ("codes", "zeros", "scales")}
    if contract is None:
        leaf = stored_int4.experts_from_levels(arrays["codes"], arrays["zeros"], arrays["scales"], scheme.group)
    else:
        leaf = stored_int4.from_levels(arrays["codes"], arrays["zeros"], arrays["scales"], contract, scheme.group)
    if leaf is None and contract is not None and layout.mesh is None:  # act order: kept on one device only
        groups = _leaf([weights[0].view("groups")], t, info, jnp.int32, layout)
        leaf = stored_int4.from_levels(arrays["codes"], arrays["zeros"], arrays["scales"], contract, scheme.group,
                                       groups)
    if leaf is None:
        log.info("%s: its 4-bit groups are not runs of %d inputs (act order in experts or on a mesh, or a group not "
                 "dividing the input), so it loads dequantized", path_of(names), scheme.group)
    return leaf


def path_of(names: list[str]) -> str:
    """A leaf's stored tensor, or its first expert's, for log lines."""
    return names[0] if len(names) == 1 else f"{names[0]} (and {len(names) - 1} more experts)"


def load_vision_weights(model_dir: str | Path, cfg: VisionLanguageConfig, dtype: Any) -> VisionLanguageWeights:
    """A vision-language checkpoint's vision tower and projector (see checkpoint/vision_weights)."""
    return vision_weights.read_llava_weights(safetensors_index(Path(model_dir)), open_safetensors, cfg, dtype)


def load_weights(
    model_dir: str | Path, dtype: Any, progress: bool = True, layout: Layout = UNSHARDED,
    transform: LeafTransform | None = None, cfg: ModelConfig | None = None, keep_int4: bool = False,
) -> tuple[ModelConfig, Weights]:
    """Config and weights from an HF directory or a converted one, each leaf in its `layout` sharding.

    transform: applied to each leaf of an HF checkpoint as it is read (see `load_hf_weights`); a
    converted checkpoint is restored as it was stored. cfg: the config to read the weights by (None:
    the directory's; a pooling model's is read as tied, so no output head is asked for).
    """
    cfg = load_config(model_dir) if cfg is None else cfg
    if is_converted(model_dir):
        return cfg, restore_converted(model_dir, cfg, dtype, layout)
    return cfg, load_hf_weights(model_dir, cfg, dtype, progress, layout, transform, keep_int4)
