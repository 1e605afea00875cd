"""InternViT, InternVL's vision tower, as a pure function over its weight pytree (HF's InternVLVisionModel).

A pre-norm ViT like CLIP's (a class token first, learned absolute positions over class token and patches, a
biased patch convolution) with InternViT's own parts: each layer scales its attention and MLP outputs by learned
per-channel factors before adding them (layer scale, `lambda_1` / `lambda_2`); norms are LayerNorm (InternViT-300M)
or RMSNorm (InternViT-6B, which also RMS-norms q and k over all heads, `use_qk_norm`); q/k/v may have no bias.
Tiles always reach it at `image_size`, so the positions are used as stored: HF interpolates them only for
another size. `hidden_states` follows HF's `hidden_states` (index 0: the embeddings).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.models.norms import rms_norm
from jaxinfer.models.vision_tower import layer_norm, patchify, vision_activation
from jaxinfer.parallel.array_info import ArrayInfo

NORM_TYPES = ("layer_norm", "rms_norm")
QK_NORM_EPS = 1e-6  # HF builds the q/k norms with RMSNorm's default eps, not layer_norm_eps


@dataclasses.dataclass(frozen=True)
class InternViTConfig:
    """The shape of one InternViT tower (hashable: a static argument of its program)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    eps: float = 1e-6
    activation: str = "gelu"
    norm_type: str = "layer_norm"
    attention_bias: bool = True  # q/k/v biases (the output projection always has one)
    qk_norm: bool = False  # RMSNorm of q and k over all heads (InternViT-6B)
    positions: bool = True  # use_absolute_position_embeddings
    final_norm: bool = False  # a LayerNorm after the last layer (HF's use_mean_pooling false)

    @property
    def num_patches(self) -> int:
        """Patches per tile."""
        return (self.image_size // self.patch_size) ** 2


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class InternViTLayer:
    """One layer; projections as [in, out]; biases None where the config has none (RMSNorm's, bias-free q/k/v)."""

    norm1: jax.Array  # [D] layernorm_before
    norm1_bias: jax.Array | None
    wq: jax.Array  # [D, D]
    bq: jax.Array | None
    wk: jax.Array
    bk: jax.Array | None
    wv: jax.Array
    bv: jax.Array | None
    q_norm: jax.Array | None  # [D]
    k_norm: jax.Array | None
    wo: jax.Array  # [D, D] projection_layer
    bo: jax.Array
    lambda1: jax.Array  # [D] the attention output's layer scale
    norm2: jax.Array  # [D] layernorm_after
    norm2_bias: jax.Array | None
    fc1: jax.Array  # [D, F]
    fc1_bias: jax.Array
    fc2: jax.Array  # [F, D]
    fc2_bias: jax.Array
    lambda2: jax.Array  # [D] the MLP output's layer scale


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class InternViTWeights:
    """A whole tower: patch embedding [C * p * p, D] (channel, row, column order), positions [1 + P, D]."""

    patch: jax.Array
    patch_bias: jax.Array
    class_embed: jax.Array  # [D]
    positions: jax.Array | None
    layers: list[InternViTLayer]
    final_norm: jax.Array | None  # [D]
    final_norm_bias: jax.Array | None


def abstract_layer(cfg: InternViTConfig) -> InternViTLayer:
    """One layer's leaves as ArrayInfos (replicated: a tower is small beside its language model)."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    vec = lambda n=D, value=0.0: ArrayInfo((n,), (None,), init_value=value)  # noqa: E731
    mat = lambda a, b: ArrayInfo((a, b), (None, None))  # noqa: E731
    norm_bias = vec() if cfg.norm_type == "layer_norm" else None
    qkv_bias = vec() if cfg.attention_bias else None
    qk_norm = vec(value=1.0) if cfg.qk_norm else None
    return InternViTLayer(vec(value=1.0), norm_bias, mat(D, D), qkv_bias, mat(D, D), qkv_bias, mat(D, D), qkv_bias,
                          qk_norm, qk_norm, mat(D, D), vec(), vec(value=0.1), vec(value=1.0), norm_bias, mat(D, F),
                          vec(F), mat(F, D), vec(), vec(value=0.1))


def abstract_internvit(cfg: InternViTConfig) -> InternViTWeights:
    """Every leaf of the tower as an ArrayInfo (absent parts None)."""
    D = cfg.hidden_size
    vec = lambda value=None: ArrayInfo((D,), (None,), init_value=value)  # noqa: E731
    return InternViTWeights(
        patch=ArrayInfo((cfg.num_channels * cfg.patch_size ** 2, D), (None, None)),
        patch_bias=vec(0.0),
        class_embed=vec(),
        positions=ArrayInfo((cfg.num_patches + 1, D), (None, None)) if cfg.positions else None,
        layers=[abstract_layer(cfg) for _ in range(cfg.num_layers)],
        final_norm=vec(1.0) if cfg.final_norm else None,
        final_norm_bias=vec(0.0) if cfg.final_norm else None,
    )


def norm(x: jax.Array, weight: jax.Array, bias: jax.Array | None, eps: float) -> jax.Array:
    """LayerNorm where the norm has a bias, else RMSNorm (InternViT-6B's)."""
    return rms_norm(x, weight, eps) if bias is None else layer_norm(x, weight, bias, eps)


def plus(x: jax.Array, bias: jax.Array | None) -> jax.Array:
    """x plus a bias that may be absent."""
    return x if bias is None else x + bias


def attention(lw: InternViTLayer, x: jax.Array, cfg: InternViTConfig) -> jax.Array:
    """Full (unmasked) multi-head self-attention over each tile's tokens, x [N, S, D]; q and k RMS-normed over all
    heads first where the tower has q/k norms."""
    n, s, d = x.shape
    q, k, v = plus(x @ lw.wq, lw.bq), plus(x @ lw.wk, lw.bk), plus(x @ lw.wv, lw.bv)
    if lw.q_norm is not None:
        q, k = rms_norm(q, lw.q_norm, QK_NORM_EPS), rms_norm(k, lw.k_norm, QK_NORM_EPS)
    split = lambda y: y.reshape(n, s, cfg.num_heads, d // cfg.num_heads)  # noqa: E731
    scores = jnp.einsum("nshk,nthk->nhst", split(q), split(k)).astype(jnp.float32) * (d // cfg.num_heads) ** -0.5
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    return jnp.einsum("nhst,nthk->nshk", probs, split(v)).reshape(n, s, d) @ lw.wo + lw.bo


def encoder_layer(lw: InternViTLayer, x: jax.Array, cfg: InternViTConfig) -> jax.Array:
    """One pre-norm layer: attention, then the MLP, each scaled by its layer scale and added to the residual."""
    x = x + lw.lambda1 * attention(lw, norm(x, lw.norm1, lw.norm1_bias, cfg.eps), cfg)
    h = norm(x, lw.norm2, lw.norm2_bias, cfg.eps)
    return x + lw.lambda2 * (vision_activation(cfg.activation, h @ lw.fc1 + lw.fc1_bias) @ lw.fc2 + lw.fc2_bias)


def embed_tiles(weights: InternViTWeights, pixels: jax.Array, cfg: InternViTConfig) -> jax.Array:
    """Token embeddings [N, 1 + P, D] of tiles [N, C, S, S]: the class token, the patches, the positions."""
    x = patchify(pixels.astype(weights.patch.dtype), cfg.patch_size) @ weights.patch + weights.patch_bias
    cls = jnp.broadcast_to(weights.class_embed, (x.shape[0], 1, x.shape[-1]))
    x = jnp.concatenate([cls, x], axis=1)
    return x if weights.positions is None else x + weights.positions


def hidden_states(weights: InternViTWeights, pixels: jax.Array, cfg: InternViTConfig, depth: int) -> list[jax.Array]:
    """The residual stream [N, 1 + P, D] before the first layer and after each of the first `depth` layers (HF's
    hidden_states[0 .. depth]); layers past `depth` are not run."""
    x = embed_tiles(weights, pixels, cfg)
    states = [x]
    for lw in weights.layers[:depth]:
        x = encoder_layer(lw, x, cfg)
        states.append(x)
    return states


def last_hidden_state(weights: InternViTWeights, pixels: jax.Array, cfg: InternViTConfig) -> jax.Array:
    """The tower's output [N, 1 + P, D]: every layer, then the final LayerNorm where it has one."""
    x = hidden_states(weights, pixels, cfg, cfg.num_layers)[-1]
    return x if weights.final_norm is None else layer_norm(x, weights.final_norm, weights.final_norm_bias, cfg.eps)
