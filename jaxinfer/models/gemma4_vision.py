"""Gemma 4's images (Gemma4ForConditionalGeneration): its own ViT over a variable number of patches, pooled k x k by
position, scaled, RMS-normed without a weight and projected to the language model's width (`embed_vision`).

- Patches: the processor resizes each image, keeping its aspect, to at most max_soft_tokens x k² patches of
  `patch_size` pixels (sides multiples of k patches); a patch embeds as input_proj(2 * pixels - 1) plus learned
  column and row embeddings (`position_embedding_table` [2, S, E]).
- Layers: Gemma 4's sandwich norms (RMSNorm times w), q/k RMS-normed with a weight, v without, the 2-D rotary
  (the first half of each head's dims turned by the patch's column, the second by its row, rotate-half within
  each), scores unscaled, bidirectional over the image; a gated MLP; under `use_clipped_linears` each linear's
  input and output clamped to ranges the checkpoint stores.
- Pooler: each k x k square of patches averaged into one row (row-major over the pooled grid), times sqrt(E);
  optionally standardized (`standardize`: minus std_bias, times std_scale).

The patches go in padded to a bucket of pooled rows (models/tower_patches.gemma4_patches: 1, 2, 3, 4, 6, 8, ...:
at most 1.5x the image's, never past the processor's max_soft_tokens), their (row, column) as data: padding
patches see no image patch, take no position embedding and pool into no image row, so the image's rows are its
own size's and images share a few programs.
Each image mark of a prompt becomes <boi>, one image token per row, <eoi> (HF's Gemma4Processor). Where the text
config says `use_bidirectional_attention: vision`, an image's tokens see each other both ways on the sliding
layers only (the global layers stay causal: HF's `create_masks_for_vision_model`), the engine's `whole_images`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ConfigError, activation_name
from jaxinfer.models.mlp import gate_product
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.qwen2_vl_vision import rotate, tower_masks
from jaxinfer.models.tower_patches import TowerPatches
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("Gemma4ForConditionalGeneration",)
CLIPPED = ("wq", "wk", "wv", "wo", "gate", "up", "down")  # the layer's linears, in `clips`' row order


@dataclasses.dataclass(frozen=True)
class Gemma4TowerConfig:
    """The shape of Gemma 4's vision tower (hashable: a static argument of its program)."""

    width: int
    mlp_width: int
    depth: int
    heads: int
    kv_heads: int
    head_dim: int
    patch_size: int
    pool: int  # pooling_kernel_size: k x k patches per row
    positions: int  # position_embedding_size
    theta: float
    eps: float
    activation: str
    standardize: bool
    clipped: bool = False  # use_clipped_linears: each linear's input and output clamped to stored ranges
    num_channels: int = 3

    @property
    def patch_dims(self) -> int:
        """Pixels per patch (patch x patch x channels)."""
        return self.num_channels * self.patch_size ** 2


@dataclasses.dataclass(frozen=True)
class Gemma4VisionConfig:
    """What a Gemma 4 vision-language checkpoint adds to its language model (hashable: a static argument)."""

    vision: Gemma4TowerConfig
    text_hidden_size: int
    image_token_id: int  # the soft tokens the image's rows replace
    boi_token_id: int
    eoi_token_id: int
    bidirectional: bool  # text_config.use_bidirectional_attention == "vision"
    max_soft_tokens: int = 0  # the image processor's rows per image at most (0: unknown): the buckets' ceiling


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Gemma4TowerLayer:
    """One encoder layer; projections [in, out]."""

    attn_norm: jax.Array  # [E]
    wq: jax.Array  # [E, H * K]
    wk: jax.Array  # [E, KV * K]
    wv: jax.Array  # [E, KV * K]
    wo: jax.Array  # [H * K, E]
    q_norm: jax.Array  # [K]
    k_norm: jax.Array  # [K]
    post_attn_norm: jax.Array  # [E]
    mlp_norm: jax.Array  # [E]
    gate: jax.Array  # [E, F]
    up: jax.Array  # [E, F]
    down: jax.Array  # [F, E]
    post_mlp_norm: jax.Array  # [E]
    # use_clipped_linears: [7, 4] (input min, input max, output min, output max) of each of CLIPPED, in that order
    clips: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Gemma4VisionWeights:
    """The tower and its embedder into the language model (whose weights are Gemma 4 text's)."""

    patch: jax.Array  # [p * p * C, E] (row, column, channel order: the processor's)
    positions: jax.Array  # [2, S, E]: column embeddings, row embeddings
    layers: list[Gemma4TowerLayer]
    projection: jax.Array  # [E, D]
    std_bias: jax.Array | None = None  # [E]
    std_scale: jax.Array | None = None  # [E]


def abstract_gemma4_vision(cfg: Gemma4VisionConfig) -> Gemma4VisionWeights:
    """Every tower and embedder leaf as an ArrayInfo (replicated: the tower is small beside its language model)."""
    v = cfg.vision
    e, f, q, kv = v.width, v.mlp_width, v.heads * v.head_dim, v.kv_heads * v.head_dim
    mat = lambda a, b: ArrayInfo((a, b), (None, None))  # noqa: E731
    vec = lambda n: ArrayInfo((n,), (None,), init_value=1.0)  # noqa: E731
    clips = ArrayInfo((len(CLIPPED), 4), (None, None)) if v.clipped else None

    def layer() -> Gemma4TowerLayer:
        return Gemma4TowerLayer(vec(e), mat(e, q), mat(e, kv), mat(e, kv), mat(q, e), vec(v.head_dim),
                                vec(v.head_dim), vec(e), vec(e), mat(e, f), mat(e, f), mat(f, e), vec(e), clips)

    std = ArrayInfo((e,), (None,), init_value=0.0) if v.standardize else None
    return Gemma4VisionWeights(mat(v.patch_dims, e), ArrayInfo((2, v.positions, e), (None, None, None)),
                               [layer() for _ in range(v.depth)], mat(e, cfg.text_hidden_size), std,
                               vec(e) if v.standardize else None)


def axial_rotary(rows: jax.Array, cols: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin [N, head_dim] float32 of patches at (rows, cols) [N]: the first half of the dims by the column, the
    second by the row, each half in rotate-half layout over head_dim / 4 frequencies (HF's axial rope)."""
    half = head_dim // 2
    inv_freq = 1.0 / (np.float32(theta) ** (np.arange(0, half, 2, dtype=np.float32) / np.float32(half)))
    col, row = (jnp.asarray(index).astype(jnp.float32)[:, None] * inv_freq for index in (cols, rows))
    emb = jnp.concatenate([col, col, row, row], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def rotate_halves(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [N, heads, K]: each half of K rotated (rotate-half) by its half of cos, sin [N, K]."""
    half = x.shape[-1] // 2
    return jnp.concatenate([rotate(x[..., :half], cos[:, :half], sin[:, :half]),
                            rotate(x[..., half:], cos[:, half:], sin[:, half:])], axis=-1)


def project(lw: Gemma4TowerLayer, name: str, x: jax.Array) -> jax.Array:
    """x @ the layer's linear `name`, its input and output clamped to their stored ranges under use_clipped_linears
    (HF's Gemma4ClippableLinear)."""
    weight = getattr(lw, name)
    if lw.clips is None:
        return x @ weight
    lo_in, hi_in, lo_out, hi_out = (lw.clips[CLIPPED.index(name), i].astype(x.dtype) for i in range(4))
    return jnp.clip(jnp.clip(x, lo_in, hi_in) @ weight, lo_out, hi_out)


def attention(lw: Gemma4TowerLayer, x: jax.Array, v: Gemma4TowerConfig, cos: jax.Array, sin: jax.Array,
              mask: jax.Array) -> jax.Array:
    """Bidirectional attention over one image's patches x [N, E] (mask [N, N]: padding apart), scores unscaled."""
    n = x.shape[0]
    q = rms_norm(project(lw, "wq", x).reshape(n, v.heads, v.head_dim), lw.q_norm, v.eps, scale_first=True)
    k = rms_norm(project(lw, "wk", x).reshape(n, v.kv_heads, v.head_dim), lw.k_norm, v.eps, scale_first=True)
    values = rms_norm(project(lw, "wv", x).reshape(n, v.kv_heads, v.head_dim), jnp.ones((), jnp.float32), v.eps,
                      scale_first=True)
    q, k = rotate_halves(q, cos, sin), rotate_halves(k, cos, sin)
    group = v.heads // v.kv_heads
    k, values = jnp.repeat(k, group, axis=1), jnp.repeat(values, group, axis=1)
    scores = jnp.where(mask[None], jnp.einsum("qhd,khd->hqk", q, k).astype(jnp.float32), -jnp.inf)
    out = jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, axis=-1).astype(values.dtype), values)
    return project(lw, "wo", out.reshape(n, -1))


def encoder_layer(lw: Gemma4TowerLayer, x: jax.Array, v: Gemma4TowerConfig, cos: jax.Array, sin: jax.Array,
                  mask: jax.Array) -> jax.Array:
    """Sandwich-normed attention, then the sandwich-normed gated MLP, each added to the residual stream."""
    norm = lambda h, w: rms_norm(h, w, v.eps, scale_first=True)  # noqa: E731
    x = x + norm(attention(lw, norm(x, lw.attn_norm), v, cos, sin, mask), lw.post_attn_norm)
    h = norm(x, lw.mlp_norm)
    h = project(lw, "down", gate_product(v.activation, project(lw, "gate", h), project(lw, "up", h)))
    return x + norm(h, lw.post_mlp_norm)


def embed(weights: Gemma4VisionWeights, patches: TowerPatches, live: jax.Array) -> jax.Array:
    """Patch embeddings [N, E]: input_proj of the pixels moved to [-1, 1], plus column and row embeddings (none for
    padding)."""
    pixels = 2.0 * (patches.pixels[0] - 0.5)
    x = pixels.astype(weights.patch.dtype) @ weights.patch
    where = weights.positions[0][patches.cols] + weights.positions[1][patches.rows]
    return x + jnp.where(live[:, None], where, 0).astype(x.dtype)


def pool(x: jax.Array, patches: TowerPatches, live: jax.Array, k: int) -> jax.Array:
    """Rows [N / k², E] float32: each k x k square of the image's patches averaged, row-major over the pooled grid
    (the image's width from its patches' columns); padding patches average into none."""
    width = jnp.max(jnp.where(live, patches.cols, 0)) + 1
    square = patches.cols // k + (width // k) * (patches.rows // k)
    weights = jax.nn.one_hot(jnp.where(live, square, -1), x.shape[0] // (k * k), dtype=jnp.float32) / (k * k)
    return weights.T @ x.astype(jnp.float32)


def image_features(weights: Gemma4VisionWeights, patches: TowerPatches, cfg: Gemma4VisionConfig) -> jax.Array:
    """Language-model rows [1, bucket, D] of one image's padded patches (models/tower_patches.gemma4_patches): the
    image's (H / k) x (W / k) rows first, padding's after."""
    v = cfg.vision
    live = patches.windows >= 0
    x = embed(weights, patches, live)
    cos, sin = axial_rotary(patches.rows, patches.cols, v.head_dim, v.theta)
    mask, _ = tower_masks(patches.windows)
    for lw in weights.layers:
        x = encoder_layer(lw, x, v, cos, sin, mask)
    rows = pool(x, patches, live, v.pool) * np.float32(v.width ** 0.5)
    if weights.std_bias is not None:
        rows = (rows - weights.std_bias.astype(jnp.float32)) * weights.std_scale.astype(jnp.float32)
    rows = rows.astype(x.dtype)
    normed = rms_norm(rows, jnp.ones((), jnp.float32), v.eps, scale_first=True)
    return (normed @ weights.projection)[None]


def read_gemma4_vision_config(hf: Mapping[str, Any]) -> Gemma4VisionConfig:
    """A Gemma4VisionConfig from an HF Gemma4ForConditionalGeneration config (transformers' defaults where a field
    is left out); ConfigError naming a field it cannot run."""
    vision, text = hf.get("vision_config"), hf.get("text_config") or {}
    if not isinstance(vision, Mapping):
        raise ConfigError(f"vision_config {vision!r}: a Gemma4ForConditionalGeneration config that takes images "
                          "nests its tower's settings there as an object")
    rope = vision.get("rope_parameters") or {}
    if rope.get("rope_type", "axial") != "axial":
        raise ConfigError(f"vision_config.rope_parameters.rope_type {rope.get('rope_type')!r} is not supported; "
                          "accepted: axial")
    heads, head_dim = int(vision.get("num_attention_heads", 12)), int(vision.get("head_dim", 64))
    kv_heads = int(vision.get("num_key_value_heads", heads))
    if head_dim % 4 or heads % kv_heads:
        raise ConfigError(f"vision_config: head_dim {head_dim} must be a multiple of 4 (half turned by columns, half "
                          f"by rows) and num_attention_heads {heads} a multiple of num_key_value_heads {kv_heads}")
    bidirectional = text.get("use_bidirectional_attention")
    if bidirectional not in (None, "vision"):
        raise ConfigError(f"text_config.use_bidirectional_attention {bidirectional!r} is not supported; accepted: "
                          "null or 'vision'")
    tower = Gemma4TowerConfig(
        width=int(vision.get("hidden_size", 768)), mlp_width=int(vision.get("intermediate_size", 3072)),
        depth=int(vision.get("num_hidden_layers", 16)), heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        patch_size=int(vision.get("patch_size", 16)), pool=int(vision.get("pooling_kernel_size", 3)),
        positions=int(vision.get("position_embedding_size", 10 * 1024)),
        theta=float(rope.get("rope_theta", 100.0)), eps=float(vision.get("rms_norm_eps", 1e-6)),
        activation=activation_name(vision.get("hidden_activation", "gelu_pytorch_tanh")),
        standardize=bool(vision.get("standardize", False)), clipped=bool(vision.get("use_clipped_linears", False)),
    )
    return Gemma4VisionConfig(
        vision=tower, text_hidden_size=int(text["hidden_size"]),
        image_token_id=int(hf.get("image_token_id", 258_880)), boi_token_id=int(hf.get("boi_token_id", 255_999)),
        eoi_token_id=int(hf.get("eoi_token_id", 258_882)),
        bidirectional=bidirectional == "vision",
    )


def with_processor_limit(cfg: Gemma4VisionConfig, processor_config: Mapping[str, Any]) -> Gemma4VisionConfig:
    """cfg with the image processor's `max_soft_tokens` (transformers' default 280) as its buckets' ceiling."""
    return dataclasses.replace(cfg, max_soft_tokens=int(processor_config.get("max_soft_tokens") or 280))


def blank_pixels(cfg: Gemma4VisionConfig) -> np.ndarray:
    """Zero pixels of one pooled row (k x k patches: what warm-up compiles; other buckets compile on first use)."""
    side = cfg.vision.pool * cfg.vision.patch_size
    return np.zeros((cfg.vision.num_channels, side, side), np.float32)
