"""GLM-4.1V's, GLM-4.5V's and GLM-4.6V's vision tower (transformers' Glm4vVisionModel): one image's patches in, its
image tokens' rows out.

The patches reach the tower as Qwen2-VL's do ([blocks_h, blocks_w, merge², C * T * p * p], the image processor's
order, padded to a bucket: models/tower_patches), and attention, its 2-D rotary and the gated MLP are Qwen2.5-VL's
(models/qwen2_vl_vision) without biases (q/k/v biased only with `attention_bias`) and with RMSNorms of
`rms_norm_eps`. What differs: the patch embedding (a Conv3d with a bias) is RMS-normed (`post_conv_layernorm`), then
a learned square grid of position embeddings (`image_size / patch_size` on a side) is resampled bicubically to the
image's patch grid (HF's `grid_sample`, corners not aligned, border padding: sixteen taps a patch) and added; the
layers' MLP is `out_hidden_size` wide; after the last layer an RMSNorm (`post_layernorm`) and the downsample (a Conv2d
over each merge x merge block: one linear map of its patches) to `out_hidden_size`; then the merger: a linear, a
LayerNorm, exact GELU, and a gated MLP (`intermediate_size` wide, `hidden_act`) back to `out_hidden_size`, which is
the language model's width. The prompts, image processor and M-RoPE positions are Qwen2-VL's (its config's image
start and end tokens are `<|begin_of_image|>` and `<|end_of_image|>`, the pad `<|image|>`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError
from jaxinfer.models.glm4v import ARCHITECTURES, text_type
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
from jaxinfer.models.vision_tower import layer_norm, vision_activation
from jaxinfer.parallel.array_info import ArrayInfo

MERGER_EPS = 1e-5  # the merger's LayerNorm (torch's default)
# transformers' token ids (image, image start, image end): Glm4vConfig's and Glm46VConfig's; Glm4vMoeConfig's image
TOKENS = {"Glm4vForConditionalGeneration": (151343, 151339, 151340),
          "Glm4vMoeForConditionalGeneration": (151363, 151339, 151340),
          "Glm46VForConditionalGeneration": (151343, 151339, 151340)}


@dataclasses.dataclass(frozen=True)
class GlmTowerConfig:
    """The tower's shape (hashable: a static program argument)."""

    depth: int
    width: int  # hidden_size
    heads: int
    out_width: int  # out_hidden_size: the layers' MLP, the downsample's and the merger's output
    merger_width: int  # intermediate_size: the merger's gated MLP
    activation: str
    patch_size: int
    temporal_patch_size: int
    merge: int  # spatial_merge_size
    channels: int
    theta: float
    eps: float  # rms_norm_eps
    grid_side: int  # image_size / patch_size: the learned position grid's side
    qkv_bias: bool  # attention_bias
    bicubic: bool = True  # the position grid's resampling (models/tower_patches)

    @property
    def patch_dims(self) -> int:
        """Pixels per patch: C * T * p * p."""
        return self.channels * self.temporal_patch_size * self.patch_size ** 2


@dataclasses.dataclass(frozen=True)
class Glm4vConfig(Qwen2VLConfig):
    """A Qwen2-VL-like checkpoint (its prompts and M-RoPE positions) with GLM-4.xV's tower."""

    vision: GlmTowerConfig  # type: ignore[assignment]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GlmTowerWeights:
    """Linear weights [in, out]: patch embedding [C*T*p*p, E] and bias, norms, position grid [side², E], layers,
    downsample [merge² E, O] and bias, merger (proj [O, O], LayerNorm, gate and up [O, F], down [F, O])."""

    patch: jax.Array
    patch_bias: jax.Array
    post_conv_norm: jax.Array
    pos_embed: jax.Array
    blocks: list[QwenBlock]
    post_norm: jax.Array
    downsample: jax.Array
    downsample_bias: jax.Array
    merger_proj: jax.Array
    merger_norm: jax.Array
    merger_norm_bias: jax.Array
    merger_gate: jax.Array
    merger_up: jax.Array
    merger_down: jax.Array


def abstract_glm4v(cfg: Glm4vConfig) -> GlmTowerWeights:
    """Every tower and merger leaf as an ArrayInfo."""
    v = cfg.vision
    e, o, f = v.width, v.out_width, v.merger_width
    vec = lambda n, value=0.0: ArrayInfo((n,), (None,), init_value=value)  # noqa: E731
    mat = lambda a, b: ArrayInfo((a, b), (None, None))  # noqa: E731

    def block() -> QwenBlock:
        qkv_bias = vec(3 * e) if v.qkv_bias else None
        return QwenBlock(vec(e, 1.0), None, mat(e, 3 * e), qkv_bias, mat(e, e), None, vec(e, 1.0), None,
                         mat(e, o), None, mat(o, e), None, up=mat(e, o))

    return GlmTowerWeights(mat(v.patch_dims, e), vec(e), vec(e, 1.0), mat(v.grid_side ** 2, e),
                           [block() for _ in range(v.depth)], vec(e, 1.0), mat(v.merge ** 2 * e, o), vec(o),
                           mat(o, o), vec(o, 1.0), vec(o), mat(o, f), mat(o, f), mat(f, o))


def merger(weights: GlmTowerWeights, x: jax.Array, activation: str) -> jax.Array:
    """Language-model rows [N, O] of downsampled blocks x [N, O]."""
    h = layer_norm(x @ weights.merger_proj, weights.merger_norm, weights.merger_norm_bias, MERGER_EPS)
    h = jax.nn.gelu(h, approximate=False)
    gate = vision_activation(activation, h @ weights.merger_gate)
    return (gate * (h @ weights.merger_up)) @ weights.merger_down


def image_features(weights: GlmTowerWeights, patches: TowerPatches, cfg: Glm4vConfig) -> jax.Array:
    """Language-model rows [1, bucket blocks, D] of one image's padded patches (models/tower_patches); the rows past
    the image's blocks are padding's."""
    v = cfg.vision
    x = patches.pixels.reshape(-1, v.patch_dims).astype(weights.patch.dtype) @ weights.patch + weights.patch_bias
    x = norm(x, weights.post_conv_norm, None, v.eps)
    grid = jnp.einsum("nt,nte->ne", patches.grid_weights, weights.pos_embed[patches.grid_taps].astype(jnp.float32))
    x = x + grid.astype(x.dtype)
    cos, sin = rotary(patches.rows, patches.cols, v.width // v.heads, v.theta)
    mask, _ = tower_masks(patches.windows)
    for b in weights.blocks:
        x = x + attention(b, norm(x, b.norm1, None, v.eps), v.heads, cos, sin, mask)
        x = x + mlp(b, norm(x, b.norm2, None, v.eps), v.activation)
    x = norm(x, weights.post_norm, None, v.eps).reshape(-1, v.merge ** 2 * v.width)
    return merger(weights, x @ weights.downsample + weights.downsample_bias, v.activation)[None]


def read_tower_config(vision: Mapping[str, Any], text_width: int) -> GlmTowerConfig:
    """The tower's config from an HF Glm4vVisionConfig (transformers' defaults for fields it leaves out); ConfigError
    naming a field it cannot run."""
    act = vision.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise ConfigError(f"vision_config.hidden_act {act!r} is not supported; supported: {ACTIVATIONS}")
    width, heads = int(vision.get("hidden_size", 1536)), int(vision.get("num_heads", 12))
    if width % heads or (width // heads) % 4:
        raise ConfigError(f"vision_config: hidden_size {width} over num_heads {heads} must give a head size that "
                          "is a multiple of 4 (its 2-D rotary turns a quarter of it by rows, a quarter by columns)")
    image, patch = vision.get("image_size", 336), vision.get("patch_size", 14)
    if not isinstance(image, int) or not isinstance(patch, int) or image % patch:
        raise ConfigError(f"vision_config.image_size {image} must be one int, a multiple of patch_size {patch}")
    out = int(vision.get("out_hidden_size", 4096))
    if out != text_width:
        raise ConfigError(f"vision_config.out_hidden_size {out} must be the language model's hidden_size "
                          f"{text_width} (the merger's rows replace the image tokens' embeddings)")
    rope = vision.get("rope_parameters") or {}
    if rope.get("rope_type", "axial") != "axial":
        raise ConfigError(f"vision_config.rope_parameters.rope_type {rope['rope_type']!r} is not supported; "
                          "supported: axial")
    return GlmTowerConfig(
        depth=int(vision.get("depth", 24)), width=width, heads=heads, out_width=out,
        merger_width=int(vision.get("intermediate_size", 13696)), activation=act, patch_size=patch,
        temporal_patch_size=int(vision.get("temporal_patch_size", 2)), merge=int(vision.get("spatial_merge_size", 2)),
        channels=int(vision.get("in_channels", 3)), theta=float(rope.get("rope_theta", 10000.0)),
        eps=float(vision.get("rms_norm_eps", 1e-5)), grid_side=image // patch,
        qkv_bias=bool(vision.get("attention_bias", False)),
    )


def read_glm4v_config(hf: Mapping[str, Any]) -> Glm4vConfig:
    """A Glm4vConfig from an HF GLM-4.1V / GLM-4.5V / GLM-4.6V config (nested, as transformers writes them)."""
    arch = hf["architectures"][0]
    if arch not in ARCHITECTURES:
        raise ConfigError(f"{arch} is not a GLM-4.xV architecture; supported: {', '.join(ARCHITECTURES)}")
    text_type(hf)  # a GLM-4.6V text_config of another model type is refused by name
    text = hf.get("text_config") or {}
    width = int(text.get("hidden_size", 4096))
    image, start, end = TOKENS[arch]
    return Glm4vConfig(
        vision=read_tower_config(hf.get("vision_config") or {}, width), text_hidden_size=width,
        image_token_id=int(hf.get("image_token_id", image)),
        vision_start_token_id=int(hf.get("image_start_token_id", start)),
        vision_end_token_id=int(hf.get("image_end_token_id", end)),
    )
