"""IBM Granite (Granite 3.x dense): the Llama layer with four scalar multipliers.

`embedding_multiplier` scales the embeddings, `attention_multiplier` is the softmax scale itself (it
replaces head_dim ** -0.5; transformers' default is 1.0), `residual_multiplier` scales each sublayer's
output before its residual add and the logits are divided by `logits_scaling`. Every multiplier a
config leaves out is 1.0, as transformers reads it. The weights and their checkpoint names are Llama's.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family
from jaxinfer.models.llama import LayerWeights, abstract_layer, hf_leaves
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, self_attention
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("GraniteForCausalLM",)
MULTIPLIERS = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")
HF_MAX_POSITIONS = 2048  # transformers' default for the Granite configs


def scaled(x: jax.Array, multiplier: float) -> jax.Array:
    """x times a Python float, in float32 and rounded once to x's dtype, as torch multiplies a 16-bit tensor
    by a Python scalar (x * multiplier in bf16 would round 0.22 to 0.2197 first)."""
    return x if multiplier == 1.0 else (x.astype(jnp.float32) * multiplier).astype(x.dtype)


def scaled_residual_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
    mlp: Callable[[jax.Array, Layout], jax.Array], attention: Callable = self_attention,
) -> tuple[jax.Array, Any]:
    """One pre-norm block whose attention and mlp(normed residual, layout) outputs are each scaled by
    `residual_multiplier` before they are added to the residual stream (`attention`: MiniCPM3's latent one), each
    output normed first where the layer has `post_attn_norm` / `post_mlp_norm` (HyperCLOVA X's Peri-LN)."""
    layout, eps, multiplier = cache.layout, cfg.rms_norm_eps, cfg.residual_multiplier
    out, cache = attention(cfg, rms_norm(x, lw.attn_norm, eps), cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(x + scaled(post_norm(out, getattr(lw, "post_attn_norm", None), eps), multiplier), HIDDEN)
    h = post_norm(mlp(rms_norm(x, lw.mlp_norm, eps), layout), getattr(lw, "post_mlp_norm", None), eps)
    return layout.constrain(x + scaled(h, multiplier), HIDDEN), cache


def post_norm(x: jax.Array, weight: jax.Array | None, eps: float) -> jax.Array:
    """x RMS-normed by `weight`, or x itself where the layer has no such norm (None)."""
    return x if weight is None else rms_norm(x, weight, eps)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: LayerWeights, layer: int, positions: jax.Array, rope: RopeTables
) -> tuple[jax.Array, Any]:
    """Attention, then the gated MLP, each scaled before its residual add."""

    def mlp(h: jax.Array, layout: Layout) -> jax.Array:
        return gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)

    return scaled_residual_layer(cfg, x, cache, lw, layer, positions, rope, mlp)


def multipliers(hf: Mapping[str, Any], arch: str) -> dict[str, float]:
    """The four multipliers as ModelConfig fields (attention_multiplier as attn_scale), each checked positive."""
    read = {}
    for name in MULTIPLIERS:
        value = field(hf, name, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{name} {value!r} is not supported for {arch}: it must be a positive number")
        read[name] = float(value)
    return dict(embedding_multiplier=read["embedding_multiplier"], attn_scale=read["attention_multiplier"],
                residual_multiplier=read["residual_multiplier"], logits_scaling=read["logits_scaling"])


TOKEN_IDS = dict(bos_token_id=1, eos_token_id=2)  # GraniteConfig's, GraniteMoe*Config's defaults


def granite_fields(hf: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """What every Granite architecture reads the same way: Llama's fields, the multipliers, attention biases
    on q/k/v/o together (`attention_bias`) and no sliding windows; bos and eos ids 1 and 2 where the config leaves
    them out, as every Granite config class defaults them."""
    fields = common_fields({**TOKEN_IDS, **hf}, arch)
    bias = bool(hf.get("attention_bias", False))
    return dict(
        fields,
        max_position_embeddings=int(field(hf, "max_position_embeddings", HF_MAX_POSITIONS)),
        qkv_bias=bias,
        o_bias=bias,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        **multipliers(hf, arch),
    )


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Granite HF config."""
    return ModelConfig(**granite_fields(hf, arch))


FAMILY = Family("granite", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
