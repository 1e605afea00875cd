"""Cohere2-MoE (`Cohere2MoeForCausalLM`): Cohere 2's parallel layer (models/cohere2: one norm feeding attention and
the MLP, sliding layers rotating adjacent pairs, logits times `logit_scale`) with routed experts, as transformers'
modeling_cohere2_moe has it.

- `mlp_layer_types` marks each MLP "dense" (a SwiGLU of `prefix_dense_intermediate_size`, else
  `intermediate_size`) or "sparse": `num_experts_per_tok` of `num_experts` SwiGLU experts of `intermediate_size`
  by the top-k router logits, weighted by their softmax (`expert_selection_fn` "softmax") or their sigmoids,
  renormalised with `norm_topk_prob` ("sigmoid": `cfg.sigmoid_top_k`); beside them `num_shared_experts` x
  `intermediate_size` shared hidden units, their output summed with the routed one or averaged with it
  (`shared_expert_combination_strategy`: `cfg.shared_expert_average`).
- Full-attention layers take no rotary embedding but the dense ones when `prefix_dense_sliding_window_pattern` is
  1 (transformers' `force_rope`); sliding ones rotate as Cohere 2's.
- The norms are RMSNorms where `rms_norm_eps` is set, else Cohere's bias-free LayerNorms (`layer_norm_eps`).
- Without `layer_types` / `mlp_layer_types` the first `first_k_dense_replace` layers are dense (their windows by
  `prefix_dense_sliding_window_pattern`), the rest sparse (by `sliding_window_pattern`), as Cohere2MoeConfig builds
  them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.cohere2 import ParallelLayerWeights, parallel_layer
from jaxinfer.models.cohere2 import abstract_layer as dense_layer
from jaxinfer.models.cohere2 import hf_leaves as dense_hf_leaves
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import linear
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.moe import abstract_moe_layer, experts_hf_leaves, experts_output
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.shared_expert import abstract_shared_moe_layer, shared_expert_hf_leaves
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("Cohere2MoeForCausalLM",)
SELECTIONS = ("softmax", "sigmoid")
COMBINATIONS = ("sum", "average")
# Cohere2MoeConfig's defaults for the fields a config may leave out.
HF_DEFAULTS = dict(logit_scale=0.0625, max_position_embeddings=8192, layer_norm_eps=1e-5, bos_token_id=5,
                   eos_token_id=255001, tie_word_embeddings=True, sliding_window=4096, sliding_window_pattern=4,
                   head_dim=128, num_experts=8, num_experts_per_tok=2, num_shared_experts=0, norm_topk_prob=True,
                   shared_expert_combination_strategy="average", expert_selection_fn="softmax",
                   prefix_dense_sliding_window_pattern=1, first_k_dense_replace=0)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Any:
    """Cohere 2's dense layer, or its attention beside routed (and any shared) experts: no second norm."""
    if not cfg.is_moe_layer(layer):
        return dense_layer(cfg, layer)
    routed = abstract_shared_moe_layer(cfg, gated=False) if cfg.shared_expert_intermediate_size else \
        abstract_moe_layer(cfg)
    return dataclasses.replace(routed, mlp_norm=None)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Cohere 2's names; the router at `mlp.gate`, the experts at `mlp.experts.{e}`, shared ones at
    `mlp.shared_experts`."""
    mlp = "model.layers.{i}.mlp."
    return {
        **dense_hf_leaves(cfg),
        "router": HFLeaf(mlp + "gate.weight", "transpose", (cfg.num_experts, cfg.hidden_size)),
        **experts_hf_leaves(cfg, mlp + "experts.", ("gate_proj", "up_proj", "down_proj")),
        **shared_expert_hf_leaves(cfg, mlp, "shared_experts.", gated=False),
    }


def routing(x2: jax.Array, router: jax.Array, cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """Weights [N, k] (float32) and experts [N, k] of rows x2 [N, D]: the top-k logits' softmax or sigmoids."""
    top, experts = jax.lax.top_k(linear(x2, router).astype(jnp.float32), cfg.experts_per_token)
    if not cfg.sigmoid_top_k:
        return jax.nn.softmax(top, axis=-1), experts
    weights = jax.nn.sigmoid(top)
    return (weights / jnp.sum(weights, axis=-1, keepdims=True) if cfg.norm_topk_prob else weights), experts


def moe_block(h: jax.Array, lw: Any, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The routed experts' output for h [B, T, D], with the shared experts' summed or averaged in, in h's dtype."""
    x2 = h.reshape(-1, h.shape[-1])
    weights, experts = routing(x2, lw.router, cfg)
    out = experts_output(x2, weights, experts, lw, layout, cfg.activation).astype(h.dtype).reshape(h.shape)
    if getattr(lw, "shared_gate", None) is None:
        return out
    out = out + gated_mlp(h, lw.shared_gate, lw.shared_up, lw.shared_down, cfg.activation)
    return out / 2 if cfg.shared_expert_average else out


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """x + attention(norm(x)) + MLP(norm(x)), the MLP dense or routed experts."""
    if isinstance(lw, ParallelLayerWeights):
        mlp = lambda h: gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)  # noqa: E731
    else:
        mlp = lambda h: moe_block(h, lw, cfg, cache.layout)  # noqa: E731
    return parallel_layer(cfg, x, cache, lw, layer, positions, rope, mlp)


def layer_kinds(hf: Mapping[str, Any], layers: int) -> tuple[list[str], list[str]]:
    """(layer_types, mlp_layer_types) as Cohere2MoeConfig builds them where the config has none."""
    dense = int(hf["first_k_dense_replace"])
    prefix, pattern = int(hf["prefix_dense_sliding_window_pattern"]), int(hf["sliding_window_pattern"])
    kinds = field(hf, "layer_types", None) or (
        ["sliding_attention" if (i + 1) % prefix else "full_attention" for i in range(dense)]
        + ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers - dense)])
    mlps = field(hf, "mlp_layer_types", None) or ["dense" if i < dense else "sparse" for i in range(layers)]
    if len(kinds) != layers or not set(kinds) <= {"sliding_attention", "full_attention"} or len(mlps) != layers \
            or not set(mlps) <= {"dense", "sparse"}:
        raise ConfigError(f"layer_types {kinds!r} and mlp_layer_types {mlps!r} must give each of the {layers} layers "
                          "one of ['sliding_attention', 'full_attention'] and one of ['dense', 'sparse']")
    return kinds, mlps


def check_choices(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse router and shared-expert settings transformers' Cohere2-MoE does not run either."""
    for name, accepted in (("expert_selection_fn", SELECTIONS), ("shared_expert_combination_strategy", COMBINATIONS)):
        if hf[name] not in accepted:
            raise ConfigError(f"{name} {hf[name]!r} is not supported for {arch}; supported: {', '.join(accepted)}")
    window, scale = hf["sliding_window"], hf["logit_scale"]
    if window is None or int(window) < 1:
        raise ConfigError(f"sliding_window {window!r} is not supported for {arch}: an integer >= 1")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
        raise ConfigError(f"logit_scale {scale!r} is not supported for {arch}: a number > 0")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Cohere2-MoE HF config (Cohere2MoeConfig's defaults where a key is absent)."""
    hf = {**HF_DEFAULTS, **{k: v for k, v in hf.items() if v is not None or k == "sliding_window"}}
    check_choices(hf, arch)
    fields = common_fields({k: v for k, v in hf.items() if k != "layer_types"}, arch)
    layers, width = fields["num_layers"], int(hf["intermediate_size"])
    kinds, mlps = layer_kinds(hf, layers)
    forced = int(hf["prefix_dense_sliding_window_pattern"]) == 1  # transformers' force_rope on the dense layers
    rotated = [kind == "sliding_attention" or (forced and mlp == "dense") for kind, mlp in zip(kinds, mlps)]
    rms = hf.get("rms_norm_eps")
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **{**fields, "intermediate_size": int(field(hf, "prefix_dense_intermediate_size", width)),
           "rms_norm_eps": float(rms if rms is not None else hf["layer_norm_eps"])},
        layer_norm=rms is None,
        qkv_bias=bias,
        o_bias=bias,
        rope_interleaved=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        logits_scaling=1.0 / float(hf["logit_scale"]),
        layer_windows=tuple(int(hf["sliding_window"]) if kind == "sliding_attention" else 0 for kind in kinds),
        nope_layers=tuple(i for i, r in enumerate(rotated) if not r),
        dense_layers=tuple(i for i, mlp in enumerate(mlps) if mlp == "dense"),
        shared_expert_intermediate_size=int(hf["num_shared_experts"]) * width,
        shared_expert_average=hf["shared_expert_combination_strategy"] == "average",
        sigmoid_top_k=hf["expert_selection_fn"] == "sigmoid",
        norm_topk_prob=bool(hf["norm_topk_prob"]),
        **moe_fields(hf, "num_experts", width),
    )


FAMILY = Family("cohere2_moe", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
