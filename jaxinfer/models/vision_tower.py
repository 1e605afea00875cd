"""A ViT image encoder as a pure function over its weight pytree: CLIP's and SigLIP's vision towers.

Both are pre-norm transformers over the image's patches: a patch embedding (a strided
convolution, computed here as one matmul over flattened patches), learned position embeddings,
then layers of LayerNorm -> attention (q/k/v/o with biases, every patch sees every patch) and
LayerNorm -> fc1 -> activation -> fc2. CLIP prepends a class token and norms the embeddings
before the first layer (`pre_layrnorm`); SigLIP has neither but biases its patch convolution.
`hidden_states` returns the residual stream after each layer, as HF's `output_hidden_states`
does (index 0: the embeddings after CLIP's pre-norm), which is what LLaVA reads. Idefics2's tiles of many sizes,
zero-padded to one, give each patch a position id (its bucket of the learned grid) and a key mask (padding
patches are seen by no patch); the others take every patch its own position and see all of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError
from jaxinfer.parallel.array_info import ArrayInfo

# HF vision activations -> how they are computed
VISION_ACTIVATIONS = ("quick_gelu", "gelu", "gelu_pytorch_tanh", "gelu_new")


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """The shape of one vision tower (hashable: a static argument of its program)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    eps: float = 1e-5
    activation: str = "quick_gelu"
    class_token: bool = True  # CLIP: a class token first and a pre-norm; SigLIP: neither, a biased patch conv
    post_norm: bool = True

    @property
    def num_patches(self) -> int:
        """Patches per image."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_positions(self) -> int:
        """Tokens per image in the tower (patches plus CLIP's class token)."""
        return self.num_patches + int(self.class_token)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class VisionLayer:
    """One encoder layer; projections as [in, out]."""

    norm1: jax.Array  # [D]
    norm1_bias: jax.Array  # [D]
    wq: jax.Array  # [D, D]
    bq: jax.Array  # [D]
    wk: jax.Array
    bk: jax.Array
    wv: jax.Array
    bv: jax.Array
    wo: jax.Array
    bo: jax.Array
    norm2: jax.Array
    norm2_bias: jax.Array
    fc1: jax.Array  # [D, F]
    fc1_bias: jax.Array  # [F]
    fc2: jax.Array  # [F, D]
    fc2_bias: jax.Array  # [D]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class VisionWeights:
    """A whole tower: patch embedding [C * p * p, D] (channel, row, column order), positions [P, D]."""

    patch: jax.Array
    patch_bias: jax.Array | None
    class_embed: jax.Array | None  # [D]
    positions: jax.Array
    pre_norm: jax.Array | None  # [D]
    pre_norm_bias: jax.Array | None
    layers: list[VisionLayer]
    post_norm: jax.Array | None
    post_norm_bias: jax.Array | None


def abstract_layer(cfg: VisionConfig) -> VisionLayer:
    """One layer's leaves as ArrayInfos (replicated: a tower is small beside its language model)."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    vec = lambda n, value=None: ArrayInfo((n,), (None,), init_value=value)  # noqa: E731
    mat = lambda a, b: ArrayInfo((a, b), (None, None))  # noqa: E731
    return VisionLayer(vec(D, 1.0), vec(D, 0.0), mat(D, D), vec(D, 0.0), mat(D, D), vec(D, 0.0), mat(D, D),
                       vec(D, 0.0), mat(D, D), vec(D, 0.0), vec(D, 1.0), vec(D, 0.0), mat(D, F), vec(F, 0.0),
                       mat(F, D), vec(D, 0.0))


def abstract_vision(cfg: VisionConfig) -> VisionWeights:
    """Every leaf of the tower as an ArrayInfo (absent parts None)."""
    D = cfg.hidden_size
    clip = cfg.class_token
    vec = lambda value=None: ArrayInfo((D,), (None,), init_value=value)  # noqa: E731
    return VisionWeights(
        patch=ArrayInfo((cfg.num_channels * cfg.patch_size**2, D), (None, None)),
        patch_bias=None if clip else vec(0.0),
        class_embed=vec() if clip else None,
        positions=ArrayInfo((cfg.num_positions, D), (None, None)),
        pre_norm=vec(1.0) if clip else None,
        pre_norm_bias=vec(0.0) if clip else None,
        layers=[abstract_layer(cfg) for _ in range(cfg.num_layers)],
        post_norm=vec(1.0) if cfg.post_norm else None,
        post_norm_bias=vec(0.0) if cfg.post_norm else None,
    )


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """LayerNorm with a bias, in float32 (torch's LayerNorm upcasts 16-bit inputs too)."""
    x32 = x.astype(jnp.float32)
    centred = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    normed = centred * jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def vision_activation(name: str, x: jax.Array) -> jax.Array:
    """The MLP nonlinearity by its HF name."""
    if name == "quick_gelu":
        return x * jax.nn.sigmoid(1.702 * x)
    if name == "silu":
        return jax.nn.silu(x)
    return jax.nn.gelu(x, approximate=name != "gelu")


def patchify(pixels: jax.Array, patch: int) -> jax.Array:
    """Images [N, C, H, W] -> patches [N, P, C * patch * patch], row-major over the patch grid."""
    n, c, h, w = pixels.shape
    x = pixels.reshape(n, c, h // patch, patch, w // patch, patch)
    return x.transpose(0, 2, 4, 1, 3, 5).reshape(n, (h // patch) * (w // patch), c * patch * patch)


def embed_patches(weights: VisionWeights, pixels: jax.Array, cfg: VisionConfig,
                  positions: jax.Array | None = None) -> jax.Array:
    """Token embeddings [N, num_positions, D] of images [N, C, H, W]: patches, class token, positions (each patch's
    row of the learned table: positions [N, P] int32 where given, else its own)."""
    x = patchify(pixels.astype(weights.patch.dtype), cfg.patch_size) @ weights.patch
    if weights.patch_bias is not None:
        x = x + weights.patch_bias
    if weights.class_embed is not None:
        cls = jnp.broadcast_to(weights.class_embed, (x.shape[0], 1, x.shape[-1]))
        x = jnp.concatenate([cls, x], axis=1)
    x = x + (weights.positions if positions is None else weights.positions[positions])
    if weights.pre_norm is not None:
        x = layer_norm(x, weights.pre_norm, weights.pre_norm_bias, cfg.eps)
    return x


def attention(lw: VisionLayer, x: jax.Array, heads: int, key_mask: jax.Array | None = None) -> jax.Array:
    """Multi-head self-attention over each image's tokens, x [N, S, D]: every token sees all (key_mask [N, S]
    bool: only those it marks; the finite floor keeps a tile of padding alone finite, its rows unused)."""
    n, s, d = x.shape
    split = lambda y: y.reshape(n, s, heads, d // heads)  # noqa: E731
    q, k, v = split(x @ lw.wq + lw.bq), split(x @ lw.wk + lw.bk), split(x @ lw.wv + lw.bv)
    scores = jnp.einsum("nshk,nthk->nhst", q, k).astype(jnp.float32) * (d // heads) ** -0.5
    if key_mask is not None:
        scores = jnp.where(key_mask[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    out = jnp.einsum("nhst,nthk->nshk", probs, v).reshape(n, s, d)
    return out @ lw.wo + lw.bo


def encoder_layer(lw: VisionLayer, x: jax.Array, cfg: VisionConfig, key_mask: jax.Array | None = None) -> jax.Array:
    """One pre-norm layer: attention (to the keys key_mask marks, where given), then the MLP, each added to the
    residual stream."""
    x = x + attention(lw, layer_norm(x, lw.norm1, lw.norm1_bias, cfg.eps), cfg.num_heads, key_mask)
    h = layer_norm(x, lw.norm2, lw.norm2_bias, cfg.eps)
    return x + vision_activation(cfg.activation, h @ lw.fc1 + lw.fc1_bias) @ lw.fc2 + lw.fc2_bias


def hidden_states(weights: VisionWeights, pixels: jax.Array, cfg: VisionConfig, depth: int,
                  positions: jax.Array | None = None, key_mask: jax.Array | None = None) -> list[jax.Array]:
    """The residual stream [N, S, D] before the first layer and after each of the first `depth` layers
    (HF's hidden_states[0 .. depth]); layers past `depth` are not run. positions, key_mask [N, P]: see
    `embed_patches`, `attention`."""
    x = embed_patches(weights, pixels, cfg, positions)
    states = [x]
    for lw in weights.layers[:depth]:
        x = encoder_layer(lw, x, cfg, key_mask)
        states.append(x)
    return states


def last_hidden_state(weights: VisionWeights, pixels: jax.Array, cfg: VisionConfig,
                      positions: jax.Array | None = None, key_mask: jax.Array | None = None) -> jax.Array:
    """The tower's output [N, S, D]: every layer, then the post-norm (HF's last_hidden_state)."""
    x = hidden_states(weights, pixels, cfg, cfg.num_layers, positions, key_mask)[-1]
    return layer_norm(x, weights.post_norm, weights.post_norm_bias, cfg.eps)


def read_vision_config(hf: dict[str, Any]) -> VisionConfig:
    """A VisionConfig from an HF `vision_config` (its fields completed with transformers' defaults)."""
    kind = hf.get("model_type")
    if kind not in ("clip_vision_model", "siglip_vision_model"):
        raise ConfigError(f"vision_config.model_type {kind!r} is not supported; supported: clip_vision_model, "
                          "siglip_vision_model")
    act = hf.get("hidden_act")
    if act not in VISION_ACTIVATIONS:
        raise ConfigError(f"vision_config.hidden_act {act!r} is not supported; supported: {VISION_ACTIVATIONS}")
    return VisionConfig(
        hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"], image_size=hf["image_size"],
        patch_size=hf["patch_size"], num_channels=hf.get("num_channels", 3), eps=hf.get("layer_norm_eps", 1e-5),
        activation=act, class_token=kind == "clip_vision_model",
    )
