"""Llama 3.2 Vision's image encoder (transformers' MllamaVisionModel) and projector: one image's tiles -> the
states its language model's cross-attention layers attend to (models/mllama_cross). Not run by the engine yet:
the engine runs the language model on text only (models/mllama); tests/test_mllama_vision.py checks it against
transformers.

An image arrives as MllamaImageProcessor makes it: `max_num_tiles` tiles [C, S, S] (the unused ones zero), its
aspect-ratio id (1 + the index of its tile grid in `supported_aspect_ratios`) and which tiles it uses. Each tile is
cut into patches (a stride-`patch_size` convolution, no bias), given the aspect ratio's gated tile embedding, a class
token, the gated position embedding (a learned table per patch, plus a table per aspect ratio, tile and patch), a
LayerNorm, then padded to a multiple of 8 tokens (never by none: a square plus one is not a multiple of 8, so
transformers' `-pad:` slice marks just the padding). The local transformer runs over all tiles' tokens at once (a
query-key pair is masked only where both are padding: a padding tile's or a padding patch's, as transformers masks
it); after a LayerNorm and the gated post-tile embedding, the global transformer (its layers' attention and MLP
tanh-gated) runs likewise. The padding patches are dropped and the chosen local layers' outputs
(`intermediate_layers_indices`) are concatenated after the final ones, interleaved as torch.stack(dim=-1) lays
them out; the projector (a biased linear map) takes them to the text model's width: [tiles * tokens, D_text].
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, field
from jaxinfer.models.norms import layer_norm

PAD_TO = 8  # transformers pads each tile's tokens to a multiple of 8
OUTER_EPS = 1e-5  # layernorm_pre and layernorm_post: torch's default, whatever norm_eps (the layers') says


@dataclasses.dataclass(frozen=True)
class MllamaVisionConfig:
    """The vision side of an Mllama config (`vision_config`) and the text width its projector maps to."""

    image_size: int
    patch_size: int
    max_num_tiles: int
    hidden_size: int
    heads: int
    layers: int
    global_layers: int
    intermediate_layers: tuple[int, ...]
    output_dim: int
    text_hidden_size: int
    aspect_ratios: tuple[tuple[int, int], ...]
    norm_eps: float = 1e-5

    @property
    def tokens(self) -> int:
        """Tokens per tile: the patches and the class token."""
        return (self.image_size // self.patch_size) ** 2 + 1

    @property
    def frames(self) -> int:
        """Vision states per image, every tile's tokens (the keys a cross-attention layer holds per image)."""
        return self.max_num_tiles * self.tokens


def read_mllama_vision_config(hf: Mapping[str, Any]) -> MllamaVisionConfig:
    """The vision config of an MllamaForConditionalGeneration HF config; what transformers would run otherwise refused
    by name."""
    vision, text = hf["vision_config"], hf["text_config"]
    act = field(vision, "hidden_act", "gelu")
    if act != "gelu":
        raise ConfigError(f"vision_config.hidden_act {act!r} is not supported for Mllama; supported: 'gelu'")
    size, patch = int(vision["image_size"]), int(vision["patch_size"])
    layers = int(vision["num_hidden_layers"])
    picked = tuple(int(i) for i in field(vision, "intermediate_layers_indices", []))
    if any(not 0 <= i < layers for i in picked):
        raise ConfigError(f"vision_config.intermediate_layers_indices {list(picked)!r} is not supported: give "
                          f"indices of its {layers} layers")
    hidden = int(vision["hidden_size"])
    output = int(vision["vision_output_dim"])
    if output != hidden * (1 + len(picked)):
        raise ConfigError(f"vision_config.vision_output_dim {output} is not supported: the tower's output is "
                          f"hidden_size * (1 + len(intermediate_layers_indices)) = {hidden * (1 + len(picked))}")
    return MllamaVisionConfig(
        image_size=size, patch_size=patch, max_num_tiles=int(vision["max_num_tiles"]), hidden_size=hidden,
        heads=int(vision["attention_heads"]), layers=layers, global_layers=int(vision["num_global_layers"]),
        intermediate_layers=picked, output_dim=output, text_hidden_size=int(text["hidden_size"]),
        aspect_ratios=tuple(tuple(int(n) for n in r) for r in vision["supported_aspect_ratios"]),
        norm_eps=float(field(vision, "norm_eps", 1e-5)),
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class VisionLayer:
    """One encoder layer (pre-LayerNorm, bias-free attention, fc2(gelu(fc1))); a global layer's tanh gates."""

    attn_norm: jax.Array  # [D]
    attn_norm_bias: jax.Array  # [D]
    wq: jax.Array  # [D, H, K]
    wk: jax.Array  # [D, H, K]
    wv: jax.Array  # [D, H, K]
    wo: jax.Array  # [H, K, D]
    mlp_norm: jax.Array  # [D]
    mlp_norm_bias: jax.Array  # [D]
    w_up: jax.Array  # [D, F]
    b_up: jax.Array  # [F]
    w_down: jax.Array  # [F, D]
    b_down: jax.Array  # [D]
    gate_attn: jax.Array | None = None  # [1], global layers only
    gate_ffn: jax.Array | None = None  # [1]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MllamaVisionWeights:
    """The tower and the projector."""

    patch: jax.Array  # [D, C, p, p] (torch Conv2d layout)
    class_embedding: jax.Array  # [D]
    positions: jax.Array  # [N, D]
    position_gate: jax.Array  # [1]
    tile_positions: jax.Array  # [ratios + 1, T * N * D]
    pre_tile: jax.Array  # [ratios + 1, T * D]
    pre_tile_gate: jax.Array  # [1]
    post_tile: jax.Array  # [ratios + 1, T * D]
    post_tile_gate: jax.Array  # [1]
    pre_norm: jax.Array  # [D]
    pre_norm_bias: jax.Array  # [D]
    post_norm: jax.Array  # [D]
    post_norm_bias: jax.Array  # [D]
    layers: list[VisionLayer]
    global_layers: list[VisionLayer]
    projector: jax.Array  # [output_dim, D_text]
    projector_bias: jax.Array  # [D_text]


def encoder_layer(x: jax.Array, lw: VisionLayer, masked: jax.Array, eps: float) -> jax.Array:
    """x [L, D] through one layer; masked [L, L] the pairs transformers adds its float minimum to."""
    h = layer_norm(x, lw.attn_norm, eps, lw.attn_norm_bias)
    q, k, v = (jnp.einsum("ld,dhk->lhk", h, w) for w in (lw.wq, lw.wk, lw.wv))
    scores = jnp.einsum("qhk,shk->hqs", q, k) * q.shape[-1] ** -0.5
    scores = jnp.where(masked, scores + jnp.finfo(scores.dtype).min, scores)
    attn = jnp.einsum("hqs,shk->qhk", jax.nn.softmax(scores, axis=-1), v)
    out = jnp.einsum("lhk,hkd->ld", attn, lw.wo)
    x = x + (out if lw.gate_attn is None else jnp.tanh(lw.gate_attn) * out)
    h = layer_norm(x, lw.mlp_norm, eps, lw.mlp_norm_bias)
    out = jax.nn.gelu(h @ lw.w_up + lw.b_up, approximate=False) @ lw.w_down + lw.b_down
    return x + (out if lw.gate_ffn is None else jnp.tanh(lw.gate_ffn) * out)


def embed_tiles(cfg: MllamaVisionConfig, weights: MllamaVisionWeights, pixels: jax.Array, ratio: jax.Array
                ) -> jax.Array:
    """Tiles [T, C, S, S] of aspect-ratio id `ratio` -> tokens [T, N, D] before the pre-LayerNorm."""
    T, D, N = cfg.max_num_tiles, cfg.hidden_size, cfg.tokens
    p = cfg.patch_size
    patches = jax.lax.conv_general_dilated(pixels.astype(weights.patch.dtype), weights.patch, (p, p), "VALID",
                                           dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                           precision=jax.lax.Precision.HIGHEST)
    x = patches.reshape(T, D, -1).transpose(0, 2, 1)
    x = x + jnp.tanh(weights.pre_tile_gate) * weights.pre_tile[ratio].reshape(T, 1, D)
    x = jnp.concatenate([jnp.broadcast_to(weights.class_embedding, (T, 1, D)), x], axis=1)
    gate = jnp.tanh(weights.position_gate)
    x = x + (1 - gate) * weights.positions
    return x + gate * weights.tile_positions[ratio].reshape(T, N, D)


def padding_pairs(cfg: MllamaVisionConfig, tiles_used: jax.Array, padded: int) -> jax.Array:
    """[T * padded, T * padded] bool: the query-key pairs transformers masks (both a padding tile's or patch's)."""
    tile_pad = jnp.arange(cfg.max_num_tiles) >= tiles_used
    patch_pad = jnp.arange(padded) >= cfg.tokens
    pad = (tile_pad[:, None] | patch_pad[None, :]).reshape(-1)
    return pad[:, None] & pad[None, :]


def image_states(cfg: MllamaVisionConfig, weights: MllamaVisionWeights, pixels: jax.Array, ratio: jax.Array,
                 tiles_used: jax.Array) -> jax.Array:
    """One image's tiles [T, C, S, S] (aspect-ratio id `ratio`, its first `tiles_used` tiles real) -> the projected
    vision states [T * N, D_text] its cross-attention layers attend to (the unused tiles' too, as transformers)."""
    T, D, N, eps = cfg.max_num_tiles, cfg.hidden_size, cfg.tokens, cfg.norm_eps
    padded = math.ceil(N / PAD_TO) * PAD_TO
    x = layer_norm(embed_tiles(cfg, weights, pixels, ratio), weights.pre_norm, OUTER_EPS, weights.pre_norm_bias)
    x = jnp.pad(x, ((0, 0), (0, padded - N), (0, 0))).reshape(T * padded, D)
    masked = padding_pairs(cfg, tiles_used, padded)
    taps = []
    for lw in weights.layers:
        x = encoder_layer(x, lw, masked, eps)
        taps.append(x)
    x = layer_norm(x, weights.post_norm, OUTER_EPS, weights.post_norm_bias).reshape(T, padded, D)
    x = (x + jnp.tanh(weights.post_tile_gate) * weights.post_tile[ratio].reshape(T, 1, D)).reshape(T * padded, D)
    for lw in weights.global_layers:
        x = encoder_layer(x, lw, masked, eps)
    picked = jnp.stack([taps[i] for i in cfg.intermediate_layers], axis=-1).reshape(T, padded, -1)
    x = jnp.concatenate([x.reshape(T, padded, D), picked], axis=-1)[:, :N]
    return (x @ weights.projector + weights.projector_bias).reshape(T * N, -1)
