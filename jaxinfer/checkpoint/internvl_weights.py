"""InternVL's InternViT tower and projector tensors read into `InternVLWeights` (the hub's -hf checkpoints and
transformers 5.24 save them as `vision_tower.*` and `multi_modal_projector.*`; in-memory names put `model.` before
both). The class token [1, 1, D] and positions [1, 1 + P, D] are stored with a leading batch axis."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from jaxinfer.checkpoint.leaf_paths import leaf_paths, unflatten
from jaxinfer.config.errors import CheckpointError
from jaxinfer.models.internvl_vision import InternVLVisionConfig, InternVLWeights, abstract_internvl

TOWER_PREFIXES = ("vision_tower.", "model.vision_tower.")
PROJECTOR_PREFIXES = ("multi_modal_projector.", "model.multi_modal_projector.")
PATCH = "embeddings.patch_embeddings.projection.weight"
LAYER_NAMES = {  # InternViTLayer field -> tensor under encoder.layer.{i}.
    "norm1": "layernorm_before.weight", "norm1_bias": "layernorm_before.bias", "wq": "attention.q_proj.weight",
    "bq": "attention.q_proj.bias", "wk": "attention.k_proj.weight", "bk": "attention.k_proj.bias",
    "wv": "attention.v_proj.weight", "bv": "attention.v_proj.bias", "q_norm": "attention.q_norm.weight",
    "k_norm": "attention.k_norm.weight", "wo": "attention.projection_layer.weight",
    "bo": "attention.projection_layer.bias", "lambda1": "lambda_1", "norm2": "layernorm_after.weight",
    "norm2_bias": "layernorm_after.bias", "fc1": "mlp.fc1.weight", "fc1_bias": "mlp.fc1.bias",
    "fc2": "mlp.fc2.weight", "fc2_bias": "mlp.fc2.bias", "lambda2": "lambda_2",
}
TOWER_NAMES = {"patch": PATCH, "patch_bias": "embeddings.patch_embeddings.projection.bias",
               "class_embed": "embeddings.cls_token", "positions": "embeddings.position_embeddings",
               "final_norm": "layernorm.weight", "final_norm_bias": "layernorm.bias"}
PROJECTOR_NAMES = {"norm": "layer_norm.weight", "norm_bias": "layer_norm.bias", "w1": "linear_1.weight",
                   "b1": "linear_1.bias", "w2": "linear_2.weight", "b2": "linear_2.bias"}


def is_internvl(index: dict[str, Any]) -> bool:
    """Whether a checkpoint's tensors include an InternViT tower."""
    return any(p + PATCH in index for p in TOWER_PREFIXES)


def stored_name(path: str, tower: str, projector: str) -> str:
    """A leaf path ('tower.layers.1.wq', 'tower.patch', 'projector.w1') -> its stored tensor name."""
    part, leaf = path.split(".", 1)
    if part == "projector":
        return projector + PROJECTOR_NAMES[leaf]
    parts = leaf.split(".")
    if parts[0] == "layers":
        return f"{tower}encoder.layer.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    return tower + TOWER_NAMES[leaf]


def our_layout(name: str, tensor: np.ndarray) -> np.ndarray:
    """Stored -> ours: the patch conv [D, C, p, p] as [C * p * p, D], a Linear [out, in] transposed, the class
    token and positions without their batch axis."""
    if name.endswith(PATCH):
        return tensor.reshape(tensor.shape[0], -1).T
    if name.endswith("cls_token"):
        return tensor.reshape(-1)
    if name.endswith("position_embeddings"):
        return tensor.reshape(tensor.shape[1:])
    return tensor.T if tensor.ndim == 2 else tensor


def read_internvl_weights(index: dict[str, Path], open_file: Callable[[Path], Any], cfg: InternVLVisionConfig,
                          dtype: Any) -> InternVLWeights:
    """The tower and projector of an InternVL checkpoint, cast to dtype; CheckpointError naming a missing or
    misshapen tensor."""
    tower = next((p for p in TOWER_PREFIXES if p + PATCH in index), None)
    projector = next((p for p in PROJECTOR_PREFIXES if p + PROJECTOR_NAMES["w1"] in index), None)
    if tower is None or projector is None:
        raise CheckpointError(f"the checkpoint has no InternViT tower or InternVL projector (looked for "
                              f"{TOWER_PREFIXES[0]}{PATCH} and {PROJECTOR_PREFIXES[0]}{PROJECTOR_NAMES['w1']})")
    abstract = abstract_internvl(cfg)
    opened: dict[Path, Any] = {}
    arrays = {}
    for path, info in leaf_paths(abstract):
        name = stored_name(path, tower, projector)
        if name not in index:
            raise CheckpointError(f"tensor {name} is missing from the checkpoint (its vision tower or projector)")
        if index[name] not in opened:
            opened[index[name]] = open_file(index[name])
        stored = opened[index[name]].get_tensor(name)
        ours = our_layout(name, stored)
        if ours.shape != info.shape:
            raise CheckpointError(f"tensor {name} in {index[name].name} has shape {stored.shape}, expected "
                                  f"{info.shape} in our layout")
        arrays[path] = jnp.asarray(ours, dtype)
    return unflatten(abstract, arrays)
