"""Gemma 4's vision tower and its embedder read into `Gemma4VisionWeights`: transformers 5.24 saves them as
`model.vision_tower.*` (each linear a `Gemma4ClippableLinear`: `<name>.linear.weight`) and
`model.embed_vision.embedding_projection.weight` (under use_clipped_linears each linear's `input_min`, `input_max`,
`output_min`, `output_max` too); the language model beside them is `model.language_model.*`
(models/text_part). The audio tower's tensors are not read: audio input is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from jaxinfer.checkpoint.leaf_paths import leaf_paths, unflatten
from jaxinfer.config.errors import CheckpointError
from jaxinfer.models.gemma4_vision import CLIPPED, Gemma4VisionConfig, Gemma4VisionWeights, abstract_gemma4_vision

TOWER = "model.vision_tower."
PATCH = "patch_embedder.input_proj.weight"
LAYER_NAMES = {  # Gemma4TowerLayer field -> tensor under encoder.layers.{i}.
    "attn_norm": "input_layernorm.weight", "wq": "self_attn.q_proj.linear.weight",
    "wk": "self_attn.k_proj.linear.weight", "wv": "self_attn.v_proj.linear.weight",
    "wo": "self_attn.o_proj.linear.weight", "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
    "post_attn_norm": "post_attention_layernorm.weight", "mlp_norm": "pre_feedforward_layernorm.weight",
    "gate": "mlp.gate_proj.linear.weight", "up": "mlp.up_proj.linear.weight", "down": "mlp.down_proj.linear.weight",
    "post_mlp_norm": "post_feedforward_layernorm.weight",
}
CLIP_BOUNDS = ("input_min", "input_max", "output_min", "output_max")  # a ClippableLinear's buffers, `clips`' columns
TOWER_NAMES = {"patch": TOWER + PATCH, "positions": TOWER + "patch_embedder.position_embedding_table",
               "std_bias": TOWER + "std_bias", "std_scale": TOWER + "std_scale",
               "projection": "model.embed_vision.embedding_projection.weight"}


def is_gemma4_vision(index: dict[str, Any]) -> bool:
    """Whether a checkpoint's tensors include Gemma 4's vision tower."""
    return TOWER + PATCH in index


def stored_names(path: str) -> list[str]:
    """A leaf path ('layers.1.wq', 'patch') -> its stored tensor name; a layer's `clips`: each clipped linear's four
    bounds, row by row."""
    parts = path.split(".")
    if parts[0] != "layers":
        return [TOWER_NAMES[path]]
    layer = f"{TOWER}encoder.layers.{parts[1]}."
    if parts[2] == "clips":
        linears = [LAYER_NAMES[name].removesuffix(".linear.weight") for name in CLIPPED]
        return [f"{layer}{linear}.{bound}" for linear in linears for bound in CLIP_BOUNDS]
    return [layer + LAYER_NAMES[parts[2]]]


def read_gemma4_vision_weights(index: dict[str, Path], open_file: Callable[[Path], Any], cfg: Gemma4VisionConfig,
                               dtype: Any) -> Gemma4VisionWeights:
    """The tower and embedder of a Gemma 4 checkpoint, cast to dtype (linears [out, in] transposed); CheckpointError
    naming a missing or misshapen tensor."""
    abstract = abstract_gemma4_vision(cfg)
    opened: dict[Path, Any] = {}
    arrays = {}
    def tensor(name: str) -> np.ndarray:
        if name not in index:
            raise CheckpointError(f"tensor {name} is missing from the checkpoint (Gemma 4's vision tower or embedder)")
        if index[name] not in opened:
            opened[index[name]] = open_file(index[name])
        return np.asarray(opened[index[name]].get_tensor(name))

    for path, info in leaf_paths(abstract):
        names = stored_names(path)
        name = names[0]
        if len(names) > 1:  # a layer's clip bounds, one scalar each
            stored = np.asarray([tensor(n) for n in names], np.float32).reshape(info.shape)
        else:
            stored = tensor(name)
        ours = stored.T if stored.ndim == 2 and len(names) == 1 else stored
        if ours.shape != info.shape:
            raise CheckpointError(f"tensor {name} in {index[name].name} has shape {stored.shape}, expected "
                                  f"{info.shape} in our layout")
        arrays[path] = jnp.asarray(ours, dtype)
    return unflatten(abstract, arrays)
