"""Mistral 3's Pixtral tower and projector tensors read into `PixtralWeights` (transformers 5.24 saves them as
`vision_tower.*` and `multi_modal_projector.*`; in-memory names put `model.` before both), and the language
model's embeddings of [IMG_BREAK] and [IMG_END] (two rows of its table, read as a slice)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from jaxinfer.checkpoint.leaf_paths import leaf_paths, unflatten
from jaxinfer.config.errors import CheckpointError
from jaxinfer.models.pixtral_vision import Mistral3Config, PixtralWeights, abstract_mistral3

TOWER_PREFIXES = ("vision_tower.", "model.vision_tower.")
PROJECTOR_PREFIXES = ("multi_modal_projector.", "model.multi_modal_projector.")
PATCH = "patch_conv.weight"
EMBED_NAMES = ("language_model.model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
               "model.embed_tokens.weight")
LAYER_NAMES = {  # PixtralLayer field -> tensor under transformer.layers.{i}.
    "attention_norm": "attention_norm.weight", "wq": "attention.q_proj.weight", "wk": "attention.k_proj.weight",
    "wv": "attention.v_proj.weight", "wo": "attention.o_proj.weight", "ffn_norm": "ffn_norm.weight",
    "gate": "feed_forward.gate_proj.weight", "up": "feed_forward.up_proj.weight",
    "down": "feed_forward.down_proj.weight",
}
TOWER_NAMES = {"patch": PATCH, "ln_pre": "ln_pre.weight"}
PROJECTOR_NAMES = {"norm": "norm.weight", "merger": "patch_merger.merging_layer.weight", "w1": "linear_1.weight",
                   "b1": "linear_1.bias", "w2": "linear_2.weight", "b2": "linear_2.bias"}


def is_pixtral(index: dict[str, Any]) -> bool:
    """Whether a checkpoint's tensors include a Pixtral tower."""
    return any(p + PATCH in index for p in TOWER_PREFIXES)


def stored_name(path: str, tower: str, projector: str) -> str:
    """A leaf path ('layers.1.wq', 'patch', 'w1') -> its stored tensor name."""
    parts = path.split(".")
    if parts[0] == "layers":
        return f"{tower}transformer.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    return tower + TOWER_NAMES[path] if path in TOWER_NAMES else projector + PROJECTOR_NAMES[path]


def our_layout(name: str, tensor: np.ndarray) -> np.ndarray:
    """Stored -> ours: the patch conv [E, C, p, p] as [C * p * p, E], a Linear [out, in] transposed."""
    if name.endswith(PATCH):
        return tensor.reshape(tensor.shape[0], -1).T
    return tensor.T if tensor.ndim == 2 else tensor


def read_mistral3_weights(index: dict[str, Path], open_file: Callable[[Path], Any], cfg: Mistral3Config,
                          dtype: Any) -> PixtralWeights:
    """The tower, projector and break / end embeddings of a Mistral 3 checkpoint, cast to dtype; CheckpointError
    naming a missing or misshapen tensor."""
    tower = next((p for p in TOWER_PREFIXES if p + PATCH in index), None)
    projector = next((p for p in PROJECTOR_PREFIXES if p + PROJECTOR_NAMES["merger"] in index), None)
    embed = next((n for n in EMBED_NAMES if n in index), None)
    if tower is None or projector is None or embed is None:
        raise CheckpointError(f"the checkpoint has no Pixtral tower, Mistral 3 projector or embedding table (looked "
                              f"for {TOWER_PREFIXES[0]}{PATCH}, {PROJECTOR_PREFIXES[0]}{PROJECTOR_NAMES['merger']} "
                              f"and {EMBED_NAMES[0]})")
    abstract = abstract_mistral3(cfg)
    opened: dict[Path, Any] = {}

    def tensor(name: str) -> Any:
        if name not in index:
            raise CheckpointError(f"tensor {name} is missing from the checkpoint (its vision tower or projector)")
        if index[name] not in opened:
            opened[index[name]] = open_file(index[name])
        return opened[index[name]]

    arrays = {}
    for path, info in leaf_paths(abstract):
        if path in ("break_row", "end_row"):
            token = cfg.image_break_token_id if path == "break_row" else cfg.image_end_token_id
            arrays[path] = jnp.asarray(tensor(embed).get_slice(embed)[token : token + 1][0], dtype)
            continue
        name = stored_name(path, tower, projector)
        stored = tensor(name).get_tensor(name)
        ours = our_layout(name, stored)
        if ours.shape != info.shape:
            raise CheckpointError(f"tensor {name} in {index[name].name} has shape {stored.shape}, expected "
                                  f"{info.shape} in our layout")
        arrays[path] = jnp.asarray(ours, dtype)
    return unflatten(abstract, arrays)
