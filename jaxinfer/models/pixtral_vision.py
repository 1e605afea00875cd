"""Mistral 3's (Mistral Small 3.1 / 3.2, Ministral 3) Pixtral vision tower and projector: one image's pixels in, its
image tokens' rows out, the [IMG_BREAK] / [IMG_END] rows in their places.

The image processor (PixtralImageProcessor) resizes each image, within `image_size`, to multiples of patch_size *
spatial_merge_size pixels; an image [C, H, W] reaches the tower as its patches in merge-block order, padded to a
bucket of merged blocks with each patch's (row, column) as data (models/tower_patches), so images of many sizes
share a program. The tower: a conv patch embedding (stride = kernel, no bias) as one matrix, `ln_pre` RMSNorm,
layers of RMSNorm, attention rotated by each patch's (row, column) (2-D rotary: the even frequencies turned by the
row, the odd by the column) and a gated MLP; every patch attends to the whole image (HF's block mask keeps images
apart: one image per program is the same), padding patches only among themselves. The projector: RMSNorm, the patch
merger (each merge x merge block's patches concatenated channel-major, as torch's unfold lays them, then a linear),
linear-GELU-linear.

The prompt holds, per merged row, one [IMG] per merged block then [IMG_BREAK], the last row's break being [IMG_END]:
the image's placeholders are that whole run, and the rows at the break and end positions are those tokens' own
embeddings (`break_row`, `end_row`, read from the language model's table), so the step's embedding override covers
the run as one image and the text tokens in it read what their embedding would give.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ConfigError
from jaxinfer.models.qwen2_vl_vision import tower_masks
from jaxinfer.models.tower_patches import TowerPatches
from jaxinfer.models.vision_tower import vision_activation
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("Mistral3ForConditionalGeneration",)
TOWER_ACTIVATIONS = ("silu", "gelu")
PROJECTOR_ACTIVATIONS = ("gelu",)
TOWER_EPS = 1e-5  # every norm of the tower (HF hard-codes it)
IMAGE_BREAK, IMAGE_END = "[IMG_BREAK]", "[IMG_END]"


@dataclasses.dataclass(frozen=True)
class PixtralTowerConfig:
    """The tower's shape (hashable: a static program argument)."""

    depth: int  # layers run: up to the feature layer
    width: int
    heads: int
    mlp_width: int
    activation: str
    patch_size: int
    channels: int
    theta: float
    image_size: int  # the longest edge the processor resizes to

    @property
    def patch_dims(self) -> int:
        """Pixels per patch: C * p * p."""
        return self.channels * self.patch_size ** 2


@dataclasses.dataclass(frozen=True)
class Mistral3Config:
    """What a Mistral3ForConditionalGeneration checkpoint adds to its language model."""

    vision: PixtralTowerConfig
    merge: int  # spatial_merge_size
    text_hidden_size: int
    norm_eps: float  # the projector's RMSNorm (text_config.rms_norm_eps)
    projector_bias: bool
    image_token_id: int  # [IMG]: one per merged block
    image_break_token_id: int | None = None  # the tokenizer's; set by load_vision
    image_end_token_id: int | None = None

    @property
    def block_pixels(self) -> int:
        """Pixels per merged block side (patch * merge): what image sides are multiples of."""
        return self.vision.patch_size * self.merge


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PixtralLayer:
    """One tower layer (Linear weights [in, out], no biases)."""

    attention_norm: jax.Array
    wq: jax.Array
    wk: jax.Array
    wv: jax.Array
    wo: jax.Array
    ffn_norm: jax.Array
    gate: jax.Array  # [E, F]
    up: jax.Array  # [E, F]
    down: jax.Array  # [F, E]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PixtralWeights:
    """Patch embedding [C*p*p, E], ln_pre, the layers; the projector (norm, merger [E*m*m, E], linear_1 [E, D],
    linear_2 [D, D]); the language model's embeddings of [IMG_BREAK] and [IMG_END] [D]."""

    patch: jax.Array
    ln_pre: jax.Array
    layers: list[PixtralLayer]
    norm: jax.Array
    merger: jax.Array
    w1: jax.Array
    b1: jax.Array | None
    w2: jax.Array
    b2: jax.Array | None
    break_row: jax.Array
    end_row: jax.Array


def abstract_mistral3(cfg: Mistral3Config) -> PixtralWeights:
    """Every tower and projector leaf as an ArrayInfo."""
    v, d = cfg.vision, cfg.text_hidden_size
    e, f = v.width, v.mlp_width
    vec = lambda n, value=0.0: ArrayInfo((n,), (None,), init_value=value)  # noqa: E731
    mat = lambda a, b: ArrayInfo((a, b), (None, None))  # noqa: E731
    bias = lambda: vec(d) if cfg.projector_bias else None  # noqa: E731
    layer = lambda: PixtralLayer(vec(e, 1.0), mat(e, e), mat(e, e), mat(e, e), mat(e, e), vec(e, 1.0),  # noqa: E731
                                 mat(e, f), mat(e, f), mat(f, e))
    return PixtralWeights(mat(v.patch_dims, e), vec(e, 1.0), [layer() for _ in range(v.depth)], vec(e, 1.0),
                          mat(e * cfg.merge ** 2, e), mat(e, d), bias(), mat(d, d), bias(), vec(d), vec(d))


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm in float32, the weight applied in x's dtype (HF's order)."""
    x32 = x.astype(jnp.float32)
    normed = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)
    return weight * normed


def rotary(rows: jax.Array, cols: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin [N, head_dim] float32 of patches at (rows, cols) [N]: the even frequencies turned by the patch's
    row, the odd by its column, the two halves alike (HF's axial rope in rotate-half layout)."""
    inv_freq = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    row, col = (jnp.asarray(index).astype(jnp.float32)[:, None] for index in (rows, cols))
    freqs = jnp.concatenate([row * inv_freq[0::2], col * inv_freq[1::2]], axis=-1)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [N, heads, K] rotated in float32 by cos, sin [N, K]."""
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    turned = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, None] + turned * sin[:, None]).astype(x.dtype)


def attention(layer: PixtralLayer, x: jax.Array, heads: int, cos: jax.Array, sin: jax.Array, mask: jax.Array
              ) -> jax.Array:
    """Bidirectional attention over one image's patches x [N, E] (mask [N, N]: padding apart)."""
    n, e = x.shape
    split = lambda w: (x @ w).reshape(n, heads, e // heads)  # noqa: E731
    q, k, v = rotate(split(layer.wq), cos, sin), rotate(split(layer.wk), cos, sin), split(layer.wv)
    scores = jnp.einsum("qhd,khd->hqk", q, k).astype(jnp.float32) * (e // heads) ** -0.5
    scores = jnp.where(mask[None], scores, -jnp.inf)
    out = jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, axis=-1).astype(v.dtype), v)
    return out.reshape(n, e) @ layer.wo


def mlp(layer: PixtralLayer, x: jax.Array, activation: str) -> jax.Array:
    """down(act(gate x) * up x)."""
    gate = x @ layer.gate
    act = jax.nn.silu(gate) if activation == "silu" else vision_activation(activation, gate)
    return (act * (x @ layer.up)) @ layer.down


def tower(weights: PixtralWeights, patches: TowerPatches, v: PixtralTowerConfig) -> jax.Array:
    """The feature layer's states [P, E] of one image's padded patches [1, P, C * p * p] (merge-block order)."""
    x = rms_norm(patches.pixels[0].astype(weights.patch.dtype) @ weights.patch, weights.ln_pre, TOWER_EPS)
    cos, sin = rotary(patches.rows, patches.cols, v.width // v.heads, v.theta)
    mask, _ = tower_masks(patches.windows)
    for layer in weights.layers:
        x = x + attention(layer, rms_norm(x, layer.attention_norm, TOWER_EPS), v.heads, cos, sin, mask)
        x = x + mlp(layer, rms_norm(x, layer.ffn_norm, TOWER_EPS), v.activation)
    return x


def project(weights: PixtralWeights, x: jax.Array, cfg: Mistral3Config) -> jax.Array:
    """Language-model rows [P / m², D] of the tower's states x [P, E] in merge-block order: norm, each block's m²
    patches concatenated channel-major (torch's unfold), the merging linear, linear-GELU-linear."""
    m, e = cfg.merge, x.shape[-1]
    x = rms_norm(x, weights.norm, cfg.norm_eps).reshape(-1, m * m, e)
    blocks = x.transpose(0, 2, 1).reshape(-1, e * m * m)
    h = (blocks @ weights.merger) @ weights.w1 + (0 if weights.b1 is None else weights.b1)
    h = jax.nn.gelu(h, approximate=False) @ weights.w2
    return h + (0 if weights.b2 is None else weights.b2)


def image_features(weights: PixtralWeights, patches: TowerPatches, cfg: Mistral3Config) -> jax.Array:
    """The rows [1, 2 x bucket, D] of one image's placeholder run (models/tower_patches.pixtral_patches): each
    merged row's image rows and the [IMG_BREAK] embedding, the last row's break being [IMG_END]'s; the rows past
    the run are padding's."""
    image = project(weights, tower(weights, patches, cfg.vision), cfg)
    table = jnp.concatenate([image, weights.break_row[None].astype(image.dtype),
                             weights.end_row[None].astype(image.dtype)])
    return table[patches.run][None]


def placeholder_count(height: int, width: int, cfg: Mistral3Config) -> int:
    """Tokens of an image's run at its processed size: per merged row its blocks and a break (or the end)."""
    return (height // cfg.block_pixels) * (width // cfg.block_pixels + 1)


def read_mistral3_config(hf: Mapping[str, Any]) -> Mistral3Config:
    """A Mistral3Config from an HF Mistral3ForConditionalGeneration config (transformers' defaults where a field
    is left out); ConfigError naming a field it cannot run."""
    from jaxinfer.models.llava import complete_config

    full = complete_config(hf)
    vision, text = full["vision_config"], full["text_config"]
    layer = full.get("vision_feature_layer", -1)
    layers = int(vision["num_hidden_layers"])
    if not isinstance(layer, int) or not -(layers + 1) <= layer <= layers:
        raise ConfigError(f"vision_feature_layer {layer!r} is not supported; accepted: one int in "
                          f"[-{layers + 1}, {layers}] (the projector's norm takes one layer's width)")
    act, projector_act = vision.get("hidden_act", "gelu"), full.get("projector_hidden_act", "gelu")
    if act not in TOWER_ACTIVATIONS:
        raise ConfigError(f"vision_config.hidden_act {act!r} is not supported; supported: {TOWER_ACTIVATIONS}")
    if projector_act not in PROJECTOR_ACTIVATIONS:
        raise ConfigError(f"projector_hidden_act {projector_act!r} is not supported; supported: "
                          f"{PROJECTOR_ACTIVATIONS}")
    width, heads = int(vision["hidden_size"]), int(vision["num_attention_heads"])
    if width % heads or (width // heads) % 4:
        raise ConfigError(f"vision_config: hidden_size {width} over num_attention_heads {heads} must give a head "
                          "size that is a multiple of 4 (its 2-D rotary turns a quarter of it by rows, a quarter "
                          "by columns)")
    rope = vision.get("rope_parameters") or {}
    tower = PixtralTowerConfig(
        depth=layer % (layers + 1), width=width, heads=heads, mlp_width=int(vision["intermediate_size"]),
        activation=act, patch_size=int(vision["patch_size"]), channels=int(vision.get("num_channels", 3)),
        theta=float(rope.get("rope_theta", vision.get("rope_theta", 10000.0))), image_size=int(vision["image_size"]),
    )
    return Mistral3Config(
        vision=tower, merge=int(full.get("spatial_merge_size", 2)), text_hidden_size=int(text["hidden_size"]),
        norm_eps=float(text.get("rms_norm_eps", 1e-5)), projector_bias=bool(full.get("multimodal_projector_bias")),
        image_token_id=int(full.get("image_token_index", full.get("image_token_id", 10))),
    )


def with_token_ids(cfg: Mistral3Config, tokenizer: Any) -> Mistral3Config:
    """cfg with the tokenizer's [IMG_BREAK] and [IMG_END] ids; ConfigError when it has neither."""
    ids = tokenizer.convert_tokens_to_ids([IMAGE_BREAK, IMAGE_END])
    if any(i is None or i == tokenizer.unk_token_id for i in ids):
        raise ConfigError(f"the tokenizer has no {IMAGE_BREAK} / {IMAGE_END} tokens (ids {ids}); Mistral 3's "
                          "image prompts need both")
    return dataclasses.replace(cfg, image_break_token_id=int(ids[0]), image_end_token_id=int(ids[1]))


def blank_pixels(cfg: Mistral3Config) -> np.ndarray:
    """Zero pixels of one merged block (what warm-up compiles the tower for; other sizes compile on first use)."""
    return np.zeros((cfg.vision.channels, cfg.block_pixels, cfg.block_pixels), np.float32)
