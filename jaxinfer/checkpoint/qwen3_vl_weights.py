"""Qwen3-VL's vision tower, merger and DeepStack mergers (`model.visual.*`, or `visual.*`) read into
`Qwen3TowerWeights`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from jaxinfer.checkpoint.qwen2_vl_weights import our_layout, read_tower_leaves
from jaxinfer.config.errors import CheckpointError
from jaxinfer.models.qwen3_vl_vision import Qwen3TowerWeights, Qwen3VLConfig, abstract_qwen3_vl

PREFIXES = ("model.visual.", "visual.")
BLOCK_NAMES = {  # QwenBlock field -> tensor under blocks.{i}.
    "norm1": "norm1.weight", "norm1_bias": "norm1.bias", "qkv": "attn.qkv.weight", "qkv_bias": "attn.qkv.bias",
    "proj": "attn.proj.weight", "proj_bias": "attn.proj.bias", "norm2": "norm2.weight", "norm2_bias": "norm2.bias",
    "fc1": "mlp.linear_fc1.weight", "fc1_bias": "mlp.linear_fc1.bias", "fc2": "mlp.linear_fc2.weight",
    "fc2_bias": "mlp.linear_fc2.bias",
}
MERGER_NAMES = {"norm": "norm.weight", "norm_bias": "norm.bias", "w1": "linear_fc1.weight", "b1": "linear_fc1.bias",
                "w2": "linear_fc2.weight", "b2": "linear_fc2.bias"}
TOWER_NAMES = {"patch": "patch_embed.proj.weight", "patch_bias": "patch_embed.proj.bias",
               "pos_embed": "pos_embed.weight"}


def stored_name(path: str) -> str:
    """A leaf path ('blocks.1.qkv', 'deepstack.0.w1', 'patch') -> its tensor name under the tower's prefix."""
    parts = path.split(".")
    if parts[0] == "blocks":
        return f"blocks.{parts[1]}.{BLOCK_NAMES[parts[2]]}"
    if parts[0] == "merger":
        return f"merger.{MERGER_NAMES[parts[1]]}"
    if parts[0] == "deepstack":
        return f"deepstack_merger_list.{parts[1]}.{MERGER_NAMES[parts[2]]}"
    return TOWER_NAMES[path]


def qwen3_layout(name: str, tensor: np.ndarray) -> np.ndarray:
    """Stored -> ours: the position grid as stored (its rows are positions), the rest as Qwen2-VL's."""
    return tensor if name.endswith(TOWER_NAMES["pos_embed"]) else our_layout(name, tensor)


def read_qwen3_vl_weights(index: dict[str, Path], open_file: Callable[[Path], Any], cfg: Qwen3VLConfig,
                          dtype: Any) -> Qwen3TowerWeights:
    """The tower and mergers of a Qwen3-VL checkpoint, cast to dtype; CheckpointError naming a missing or
    misshapen tensor."""
    prefix = next((p for p in PREFIXES if p + TOWER_NAMES["patch"] in index), None)
    if prefix is None:
        raise CheckpointError(f"the checkpoint has no Qwen3-VL vision tower (looked for {PREFIXES[0]}"
                              f"{TOWER_NAMES['patch']} and {PREFIXES[1]}{TOWER_NAMES['patch']})")
    return read_tower_leaves(index, open_file, abstract_qwen3_vl(cfg), lambda path: prefix + stored_name(path),
                             qwen3_layout, dtype)
