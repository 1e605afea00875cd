"""GLM-4.xV's vision tower and merger (`model.visual.*` as transformers saves them, or `visual.*`) read into
`GlmTowerWeights`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from jaxinfer.checkpoint.qwen2_vl_weights import our_layout, read_tower_leaves
from jaxinfer.config.errors import CheckpointError
from jaxinfer.models.glm4v_vision import Glm4vConfig, GlmTowerWeights, abstract_glm4v

PREFIXES = ("model.visual.", "visual.")
BLOCK_NAMES = {  # QwenBlock field -> tensor under blocks.{i}.
    "norm1": "norm1.weight", "qkv": "attn.qkv.weight", "qkv_bias": "attn.qkv.bias", "proj": "attn.proj.weight",
    "norm2": "norm2.weight", "fc1": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "fc2": "mlp.down_proj.weight",
}
TOWER_NAMES = {
    "patch": "patch_embed.proj.weight", "patch_bias": "patch_embed.proj.bias",
    "post_conv_norm": "post_conv_layernorm.weight", "pos_embed": "embeddings.position_embedding.weight",
    "post_norm": "post_layernorm.weight", "downsample": "downsample.weight", "downsample_bias": "downsample.bias",
    "merger_proj": "merger.proj.weight", "merger_norm": "merger.post_projection_norm.weight",
    "merger_norm_bias": "merger.post_projection_norm.bias", "merger_gate": "merger.gate_proj.weight",
    "merger_up": "merger.up_proj.weight", "merger_down": "merger.down_proj.weight",
}


def stored_name(path: str) -> str:
    """A leaf path ('blocks.1.qkv', 'downsample') -> its tensor name under the tower's prefix."""
    parts = path.split(".")
    if parts[0] == "blocks":
        return f"blocks.{parts[1]}.{BLOCK_NAMES[parts[2]]}"
    return TOWER_NAMES[path]


def glm_layout(name: str, tensor: np.ndarray) -> np.ndarray:
    """Stored -> ours: the downsample Conv2d [O, E, m, m] as [m * m * E, O] (each block's patches row-major, then
    their channels: the order the tower's rows reshape into), the position grid as stored, the rest as Qwen2-VL's."""
    if name.endswith("downsample.weight"):
        return tensor.transpose(2, 3, 1, 0).reshape(-1, tensor.shape[0])
    if name.endswith("position_embedding.weight"):
        return tensor
    return our_layout(name, tensor)


def read_glm4v_weights(index: dict[str, Path], open_file: Callable[[Path], Any], cfg: Glm4vConfig,
                       dtype: Any) -> GlmTowerWeights:
    """The tower and merger of a GLM-4.xV checkpoint, cast to dtype; CheckpointError naming a missing or misshapen
    tensor."""
    prefix = next((p for p in PREFIXES if p + TOWER_NAMES["patch"] in index), None)
    if prefix is None:
        raise CheckpointError(f"the checkpoint has no GLM-4.xV vision tower (looked for {PREFIXES[0]}"
                              f"{TOWER_NAMES['patch']} and {PREFIXES[1]}{TOWER_NAMES['patch']})")
    return read_tower_leaves(index, open_file, abstract_glm4v(cfg), lambda path: prefix + stored_name(path),
                             glm_layout, dtype)
