"""Qwen2-VL's and Qwen2.5-VL's vision tower and merger tensors (`visual.*` in the hub's checkpoints,
`model.visual.*` in transformers 5's in-memory names) read into `QwenTowerWeights`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TypeVar

import jax.numpy as jnp
import numpy as np

from jaxinfer.checkpoint.leaf_paths import leaf_paths, unflatten
from jaxinfer.config.errors import CheckpointError
from jaxinfer.models.qwen2_vl_vision import Qwen2VLConfig, QwenTowerWeights, abstract_qwen2_vl

T = TypeVar("T")
PREFIXES = ("visual.", "model.visual.")
BLOCK_NAMES = {  # QwenBlock field -> tensor under blocks.{i}. (Qwen2.5-VL's MLP names where they differ)
    "norm1": "norm1.weight", "norm1_bias": "norm1.bias", "qkv": "attn.qkv.weight", "qkv_bias": "attn.qkv.bias",
    "proj": "attn.proj.weight", "proj_bias": "attn.proj.bias", "norm2": "norm2.weight", "norm2_bias": "norm2.bias",
    "fc1": "mlp.fc1.weight", "fc1_bias": "mlp.fc1.bias", "fc2": "mlp.fc2.weight", "fc2_bias": "mlp.fc2.bias",
}
GATED_NAMES = {"fc1": "mlp.gate_proj.weight", "fc1_bias": "mlp.gate_proj.bias", "fc2": "mlp.down_proj.weight",
               "fc2_bias": "mlp.down_proj.bias", "up": "mlp.up_proj.weight", "up_bias": "mlp.up_proj.bias"}
TOWER_NAMES = {"patch": "patch_embed.proj.weight", "merger_norm": "merger.ln_q.weight",
               "merger_norm_bias": "merger.ln_q.bias", "merger_w1": "merger.mlp.0.weight",
               "merger_b1": "merger.mlp.0.bias", "merger_w2": "merger.mlp.2.weight", "merger_b2": "merger.mlp.2.bias"}


def stored_name(path: str, gated: bool) -> str:
    """A leaf path ('blocks.1.qkv', 'patch') -> its tensor name under the tower's prefix."""
    parts = path.split(".")
    if parts[0] == "blocks":
        names = {**BLOCK_NAMES, **GATED_NAMES} if gated else BLOCK_NAMES
        return f"blocks.{parts[1]}.{names[parts[2]]}"
    return TOWER_NAMES[path]


def our_layout(name: str, tensor: np.ndarray) -> np.ndarray:
    """Stored -> ours: the Conv3d [E, C, T, p, p] as [C * T * p * p, E], a Linear [out, in] transposed."""
    if name.endswith("patch_embed.proj.weight"):
        return tensor.reshape(tensor.shape[0], -1).T
    return tensor.T if tensor.ndim == 2 else tensor


def read_qwen2_vl_weights(index: dict[str, Path], open_file: Callable[[Path], Any], cfg: Qwen2VLConfig,
                          dtype: Any) -> QwenTowerWeights:
    """The tower and merger of a Qwen2-VL / Qwen2.5-VL checkpoint, cast to dtype; CheckpointError naming a
    missing or misshapen tensor."""
    prefix = next((p for p in PREFIXES if p + TOWER_NAMES["patch"] in index), None)
    if prefix is None:
        raise CheckpointError(f"the checkpoint has no Qwen2-VL vision tower (looked for {PREFIXES[0]}"
                              f"{TOWER_NAMES['patch']} and {PREFIXES[1]}{TOWER_NAMES['patch']})")
    return read_tower_leaves(index, open_file, abstract_qwen2_vl(cfg),
                             lambda path: prefix + stored_name(path, cfg.vision.windowed), our_layout, dtype)


def read_tower_leaves(index: dict[str, Path], open_file: Callable[[Path], Any], abstract: T,
                      name_of: Callable[[str], str], layout: Callable[[str, np.ndarray], np.ndarray], dtype: Any) -> T:
    """Every leaf of a tower's abstract tree read from its stored tensor (`name_of` its leaf path, `layout` turning
    it into ours), cast to dtype; CheckpointError naming a missing or misshapen tensor."""
    opened: dict[Path, Any] = {}
    arrays = {}
    for path, info in leaf_paths(abstract):
        name = name_of(path)
        if name not in index:
            raise CheckpointError(f"tensor {name} is missing from the checkpoint (its vision tower or merger)")
        file = index[name]
        if file not in opened:
            opened[file] = open_file(file)
        stored = opened[file].get_tensor(name)
        tensor = layout(name, stored)
        if tensor.shape != info.shape:
            raise CheckpointError(f"tensor {name} in {file.name} has shape {stored.shape}, expected {info.shape} "
                                  "in our layout")
        arrays[path] = jnp.asarray(tensor, dtype)
    return unflatten(abstract, arrays)
