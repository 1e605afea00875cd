"""Qwen3-VL's and Qwen3-VL-MoE's vision tower: one image's patches in, its image tokens' rows and DeepStack's
rows out.

The patches reach the tower as Qwen2-VL's do ([blocks_h, blocks_w, merge * merge, C * T * p * p], the image
processor's order), and attention, its 2-D rotary and the layers' LayerNorms are Qwen2-VL's (models/
qwen2_vl_vision). What differs: the patch embedding has a bias; a learned square grid of position embeddings
(`num_position_embeddings`) is resampled bilinearly (corners aligned) to the image's patch grid and added; the
MLP is fc1-act-fc2 with biases; and after each layer in `deepstack_visual_indexes` a DeepStack merger (its
LayerNorm over each merge block's four patches together: "post-shuffle") maps the stream to language-model
rows, which the language model adds to its hidden states at the image's tokens after its first layers
(models/embed_override). An image's rows go out side by side: [1, N, (1 + K) * D], the final merger's first.

Qwen3.5's and Qwen3.5-MoE's tower (transformers' Qwen3_5VisionModel) is this one without DeepStack: no
`deepstack_visual_indexes`, no DeepStack mergers, so its rows are the final merger's alone ([1, N, D]).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError
from jaxinfer.models.qwen2_vl_vision import (
    ACTIVATIONS,
    Qwen2VLConfig,
    QwenBlock,
    attention,
    mlp,
    norm,
    rotary,
    tower_masks,
)
from jaxinfer.models.tower_patches import TowerPatches
from jaxinfer.parallel.array_info import ArrayInfo

QWEN3_5 = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")  # no DeepStack
ARCHITECTURES = ("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration") + QWEN3_5
# transformers' Qwen3_5Config token ids (image, vision start, vision end); Qwen3-VL's are Qwen2-VL's
QWEN3_5_TOKENS = (248056, 248053, 248054, 248057)  # and the video token
QWEN3_VL_TOKENS = (151655, 151652, 151653, 151656)


@dataclasses.dataclass(frozen=True)
class Qwen3TowerConfig:
    """The tower's shape (hashable: a static program argument)."""

    depth: int
    width: int  # hidden_size
    heads: int
    mlp_width: int
    activation: str
    patch_size: int
    temporal_patch_size: int
    merge: int  # spatial_merge_size
    channels: int
    theta: float
    grid_side: int  # the learned position grid's side: sqrt(num_position_embeddings)
    deepstack: tuple[int, ...]  # deepstack_visual_indexes: the layers whose output DeepStack merges

    @property
    def patch_dims(self) -> int:
        """Pixels per patch: C * T * p * p."""
        return self.channels * self.temporal_patch_size * self.patch_size ** 2


@dataclasses.dataclass(frozen=True)
class Qwen3VLConfig(Qwen2VLConfig):
    """A Qwen2-VL-like checkpoint (its prompts and M-RoPE positions) with Qwen3-VL's tower."""

    vision: Qwen3TowerConfig  # type: ignore[assignment]

    @property
    def deepstack_layers(self) -> int:
        """How many language-model layers take DeepStack rows (added after layers 0 .. K - 1)."""
        return len(self.vision.deepstack)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class QwenMerger:
    """A patch merger: LayerNorm (over E, or over 4E after the shuffle), fc1 [4E, 4E], GELU, fc2 [4E, D]."""

    norm: jax.Array
    norm_bias: jax.Array
    w1: jax.Array
    b1: jax.Array
    w2: jax.Array
    b2: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Qwen3TowerWeights:
    """Patch embedding [C*T*p*p, E] and bias, position grid [side * side, E], layers, merger, DeepStack's."""

    patch: jax.Array
    patch_bias: jax.Array
    pos_embed: jax.Array
    blocks: list[QwenBlock]
    merger: QwenMerger
    deepstack: list[QwenMerger]


def abstract_qwen3_vl(cfg: Qwen3VLConfig) -> Qwen3TowerWeights:
    """Every tower and merger leaf as an ArrayInfo."""
    v = cfg.vision
    e, f, merged = v.width, v.mlp_width, v.width * v.merge ** 2
    vec = lambda n, value=0.0: ArrayInfo((n,), (None,), init_value=value)  # noqa: E731
    mat = lambda a, b: ArrayInfo((a, b), (None, None))  # noqa: E731

    def block() -> QwenBlock:
        return QwenBlock(vec(e, 1.0), vec(e), mat(e, 3 * e), vec(3 * e), mat(e, e), vec(e), vec(e, 1.0), vec(e),
                         mat(e, f), vec(f), mat(f, e), vec(e))

    def merger(normed: int) -> QwenMerger:
        return QwenMerger(vec(normed, 1.0), vec(normed), mat(merged, merged), vec(merged),
                          mat(merged, cfg.text_hidden_size), vec(cfg.text_hidden_size))

    return Qwen3TowerWeights(mat(v.patch_dims, e), vec(e), mat(v.grid_side ** 2, e), [block() for _ in range(v.depth)],
                             merger(e), [merger(merged) for _ in v.deepstack])


def merge(m: QwenMerger, x: jax.Array, width: int, post_shuffle: bool) -> jax.Array:
    """Language-model rows [N / merge², D] of patches x [N, E] (width: E * merge²)."""
    merged = norm(x.reshape(-1, width), m.norm, m.norm_bias) if post_shuffle else \
        norm(x, m.norm, m.norm_bias).reshape(-1, width)
    return jax.nn.gelu(merged @ m.w1 + m.b1, approximate=False) @ m.w2 + m.b2


def image_features(weights: Qwen3TowerWeights, patches: TowerPatches, cfg: Qwen3VLConfig) -> jax.Array:
    """Rows [1, bucket blocks, (1 + K) * D] of one image's padded patches (models/tower_patches): the merger's, then
    each DeepStack merger's; the rows past the image's blocks are padding's."""
    v = cfg.vision
    x = patches.pixels.reshape(-1, v.patch_dims).astype(weights.patch.dtype) @ weights.patch + weights.patch_bias
    x = x + jnp.einsum("nt,nte->ne", patches.grid_weights.astype(x.dtype), weights.pos_embed[patches.grid_taps])
    cos, sin = rotary(patches.rows, patches.cols, v.width // v.heads, v.theta)
    mask, _ = tower_masks(patches.windows)
    width, deep = v.width * v.merge ** 2, []
    for layer, b in enumerate(weights.blocks):
        x = x + attention(b, norm(x, b.norm1, b.norm1_bias), v.heads, cos, sin, mask)
        x = x + mlp(b, norm(x, b.norm2, b.norm2_bias), v.activation)
        if layer in v.deepstack:
            deep.append(merge(weights.deepstack[v.deepstack.index(layer)], x, width, post_shuffle=True))
    return jnp.concatenate([merge(weights.merger, x, width, post_shuffle=False), *deep], axis=-1)[None]


def read_qwen3_vl_config(hf: Mapping[str, Any]) -> Qwen3VLConfig:
    """A Qwen3VLConfig from an HF Qwen3-VL / Qwen3-VL-MoE / Qwen3.5 / Qwen3.5-MoE config; ConfigError naming a field
    it cannot run."""
    vision, text = hf.get("vision_config") or {}, hf.get("text_config") or {}
    act = vision.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ACTIVATIONS:
        raise ConfigError(f"vision_config.hidden_act {act!r} is not supported; supported: {ACTIVATIONS}")
    width, heads = int(vision.get("hidden_size", 1152)), int(vision.get("num_heads", 16))
    if width % heads or (width // heads) % 4:
        raise ConfigError(f"vision_config: hidden_size {width} over num_heads {heads} must give a head size that "
                          "is a multiple of 4 (its 2-D rotary turns a quarter of it by rows, a quarter by columns)")
    positions = int(vision.get("num_position_embeddings", 2304))
    side = int(round(positions ** 0.5))
    if side * side != positions:
        raise ConfigError(f"vision_config.num_position_embeddings {positions} must be a square (a side x side grid)")
    depth = int(vision.get("depth", 27))
    qwen3_5 = hf["architectures"][0] in QWEN3_5
    # Qwen3.5's tower has no DeepStack mergers, whatever its config says (transformers drops the setting)
    deepstack = () if qwen3_5 else tuple(int(i) for i in vision.get("deepstack_visual_indexes", (8, 16, 24)))
    if any(not 0 <= i < depth for i in deepstack):
        raise ConfigError(f"vision_config.deepstack_visual_indexes {list(deepstack)} must name layers 0 to "
                          f"{depth - 1} of the tower's {depth}")
    tower = Qwen3TowerConfig(
        depth=depth, width=width, heads=heads, mlp_width=int(vision.get("intermediate_size", 4304)), activation=act,
        patch_size=int(vision.get("patch_size", 16)), temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
        merge=int(vision.get("spatial_merge_size", 2)), channels=int(vision.get("in_channels", 3)),
        theta=float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0)), grid_side=side,
        deepstack=deepstack,
    )
    tokens = QWEN3_5_TOKENS if qwen3_5 else QWEN3_VL_TOKENS
    return Qwen3VLConfig(
        vision=tower, text_hidden_size=int(text.get("hidden_size", vision.get("out_hidden_size", 3584))),
        image_token_id=int(hf.get("image_token_id", tokens[0])),
        vision_start_token_id=int(hf.get("vision_start_token_id", tokens[1])),
        vision_end_token_id=int(hf.get("vision_end_token_id", tokens[2])),
        video_token_id=int(hf.get("video_token_id", tokens[3])), videos=not qwen3_5,
    )
