"""Phi-3.5-MoE (PhimoeForCausalLM; the hub's remote-code PhiMoEForCausalLM): Mixtral's layer with Phi's numerics.

Mixtral's checkpoint layout and pre-norm MoE layer (`models.mixtral`) with LayerNorms that add a bias
(the final norm's too), q/k/v/o biases with `attention_bias`, an output head with a bias (`lm_head_bias`)
and routing by `models.sparsemixer`: two experts per token, each weighted by its own masked softmax with
the `router_jitter_noise` threshold. Rotary embeddings may scale by LongRoPE (Phi-3's, `models.phi3`),
cos and sin multiplied by the config's `short_mscale` (transformers' Phimoe takes it, or `long_mscale` past
the original context, in place of LongRoPE's inferred factor).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import (
    ConfigError,
    ModelConfig,
    RopeScaling,
    activation_name,
    common_fields,
    field,
    uniform_windows,
)
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import linear
from jaxinfer.models.mixtral import abstract_layer, moe_fields
from jaxinfer.models.mixtral import hf_leaves as mixtral_hf_leaves
from jaxinfer.models.moe import MoELayerWeights, experts_output, pre_norm_layer
from jaxinfer.models.phi3 import check_longrope
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.sparsemixer import sparsemixer
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("PhimoeForCausalLM", "PhiMoEForCausalLM")
# PhimoeConfig's defaults for fields a config leaves out (where common_fields' differ).
DEFAULTS = dict(rms_norm_eps=1e-5, rope_theta=1e6, num_local_experts=16, router_jitter_noise=0.01,
                max_position_embeddings=4096 * 32)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Mixtral's names, and the LayerNorms' biases beside their weights."""
    D, layer = cfg.hidden_size, "model.layers.{i}."
    norms = {"attn_norm_bias": "input_layernorm.bias", "mlp_norm_bias": "post_attention_layernorm.bias"}
    return {**mixtral_hf_leaves(cfg), **{f: HFLeaf(layer + name, "same", (D,)) for f, name in norms.items()}}


def _rope_scaling(hf: Mapping[str, Any], scaling: RopeScaling) -> RopeScaling:
    """LongRoPE's scaling with cos and sin multiplied by the config's mscale (one value: short and long alike)."""
    if scaling.rope_type == "default":
        return scaling
    if scaling.rope_type != "longrope":
        raise ConfigError(f"rope type {scaling.rope_type!r} is not supported for Phi-3.5-MoE; supported: default, "
                          "longrope")
    params = {**(hf.get("rope_parameters") or {}), **(hf.get("rope_scaling") or {})}
    short, long = params.get("short_mscale"), params.get("long_mscale")
    if not isinstance(short, (int, float)) or short != long:
        raise ConfigError(f"rope_scaling short_mscale {short!r} and long_mscale {long!r} are not supported: one "
                          "number for both (as Phi-3.5-MoE's release sets), since the context is chosen once")
    return dataclasses.replace(scaling, attention_factor=float(short))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Phi-3.5-MoE HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch, longrope=True)
    experts = moe_fields(hf, "num_local_experts", fields["intermediate_size"], experts=16)
    if experts["experts_per_token"] != 2:
        raise ConfigError(f"num_experts_per_tok {experts['experts_per_token']} is not supported for {arch}: "
                          "sparsemixer routes to 2 experts")
    bias = bool(hf.get("attention_bias", False))
    cfg = ModelConfig(
        **{**fields, "rope_scaling": _rope_scaling(hf, fields["rope_scaling"])},
        layer_norm=True,
        norm_bias=True,
        qkv_bias=bias,
        o_bias=bias,
        lm_head_bias=bool(hf.get("lm_head_bias", False)),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], int(field(hf, "sliding_window", 0))),
        router_jitter_eps=float(hf["router_jitter_noise"]),
        **experts,
    )
    check_longrope(cfg)
    return cfg


def moe_block(x: jax.Array, lw: MoELayerWeights, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The routed experts' output for x [B, T, D] in x's dtype, routed by sparsemixer."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    weights, experts = sparsemixer(linear(x2, lw.router).astype(jnp.float32), cfg.router_jitter_eps)
    return experts_output(x2, weights, experts, lw, layout, cfg.activation).astype(x.dtype).reshape(shape)


def decoder_layer(cfg: ModelConfig, x: jax.Array, cache: Any, lw: MoELayerWeights, layer: int, positions: jax.Array,
                  rope: RopeTables) -> tuple[jax.Array, Any]:
    """One pre-norm block (LayerNorms with biases): attention over the cache, then the experts sparsemixer picks."""
    return pre_norm_layer(cfg, x, cache, lw, layer, positions, rope, lambda h, layout: moe_block(h, lw, cfg, layout))


FAMILY = Family("phimoe", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
