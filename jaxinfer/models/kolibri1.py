"""Aleph Alpha's Kolibri-1 (Kolibri1ForCausalLM): GLM-4's sandwich layer over routed experts chosen by biased logits.

Each sublayer sits between an input RMSNorm and an output one (GLM-4-0414's and Gemma 2's sandwich:
`post_attn_norm`, `post_ffn_norm` as stored). Attention is EXAONE 4.0's (`exaone4.attention_fields`:
per-head q/k RMSNorms, sliding layers by `layer_types`, by default all but every fifth, over
`sliding_window` (513); with a window the full layers take no rotary embedding), without biases.
Every layer's MLP routes each token to `num_experts_per_tok` of `num_experts` experts: the top k of
the float32 router logits plus `expert_bias` (for choosing only), weighted by the sigmoid of their own
logits, renormalised only with `norm_topk_prob`; GLM-4.5's ungated shared experts
(`shared_expert_intermediate_size` wide) add their output. Fields a config leaves out take Kolibri1Config's defaults.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.exaone4 import attention_fields
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gemma2 import sandwich_layer
from jaxinfer.models.glm4_moe import Glm4MoeLayerWeights
from jaxinfer.models.glm4_moe import abstract_layer as glm4_moe_layer
from jaxinfer.models.glm4_moe import hf_leaves as glm4_moe_hf_leaves
from jaxinfer.models.layers import linear
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.moe import experts_output
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.shared_expert import shared_expert
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("Kolibri1ForCausalLM",)
FULL_EVERY = 5  # transformers' default layer_types: every fifth layer full, the others sliding
# Kolibri1Config's defaults (Qwen3-MoE's beneath) for fields a config leaves out.
DEFAULTS = dict(num_key_value_heads=4, head_dim=128, max_position_embeddings=262144, sliding_window=513,
                moe_intermediate_size=512, shared_expert_intermediate_size=512, norm_topk_prob=False)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SandwichMoELayerWeights(Glm4MoeLayerWeights):
    """GLM-4.5's MoE layer with a norm of each sublayer's output (None only as the parent's fields default)."""

    post_attn_norm: jax.Array | None = None  # [D]
    post_mlp_norm: jax.Array | None = None  # [D]


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> SandwichMoELayerWeights:
    """GLM-4.5's MoE layer leaves (routed and shared experts, the float32 router and bias) and the output norms."""
    base = glm4_moe_layer(cfg, layer)
    norm = ArrayInfo((cfg.hidden_size,), ("embed",), init_value=1.0)
    return SandwichMoELayerWeights(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                                   post_attn_norm=norm, post_mlp_norm=norm)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """GLM-4.5's names but for the bias's and the output norms', as Aleph Alpha stores them."""
    D, layer = cfg.hidden_size, "model.layers.{i}."
    return {
        **glm4_moe_hf_leaves(cfg),
        "score_correction": HFLeaf(layer + "moe.router.expert_bias", "same", (cfg.num_experts,)),
        "post_attn_norm": HFLeaf(layer + "post_attn_norm.weight", "same", (D,)),
        "post_mlp_norm": HFLeaf(layer + "post_ffn_norm.weight", "same", (D,)),
    }


def route(logits: jax.Array, bias: jax.Array, k: int, renormalise: bool) -> tuple[jax.Array, jax.Array]:
    """Weights [N, k] float32 and expert ids [N, k] from float32 logits [N, E]: the top k of logits + bias, each
    weighted by the sigmoid of its own logit (renormalised to sum to 1 where `renormalise`)."""
    _, experts = jax.lax.top_k(logits + bias, k)
    weights = jax.nn.sigmoid(jnp.take_along_axis(logits, experts, axis=-1))
    return (weights / jnp.sum(weights, axis=-1, keepdims=True) if renormalise else weights), experts


def moe_block(x: jax.Array, lw: SandwichMoELayerWeights, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The routed experts' output plus the shared experts' for x [B, T, D], in x's dtype."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    logits = linear(x2.astype(jnp.float32), lw.router)  # float32 rows and router, as transformers computes them
    weights, experts = route(logits, lw.score_correction, cfg.experts_per_token, cfg.norm_topk_prob)
    routed = experts_output(x2, weights, experts, lw, layout, cfg.activation).astype(x.dtype).reshape(shape)
    return routed + shared_expert(x, lw, cfg.activation)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: SandwichMoELayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """norm -> attention -> norm -> residual add, then norm -> experts -> norm -> residual add."""
    return sandwich_layer(cfg, x, cache, lw, layer, positions, rope, lambda h, layout: moe_block(h, lw, cfg, layout))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Kolibri-1 HF config."""
    hf = {**DEFAULTS, **hf, "sliding_window_pattern": FULL_EVERY}  # transformers reads no other pattern
    width = int(field(hf, "moe_intermediate_size", 512))
    fields = common_fields({**hf, "intermediate_size": width}, arch)  # no dense MLP: intermediate_size unread
    shared = int(field(hf, "shared_expert_intermediate_size", 512))
    if shared < 1:
        raise ConfigError(f"shared_expert_intermediate_size {shared} is not supported for {arch}: every layer adds a "
                          "shared expert, >= 1 hidden unit wide")
    return ModelConfig(
        **fields,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        norm_topk_prob=bool(field(hf, "norm_topk_prob", False)),
        shared_expert_intermediate_size=shared,
        **attention_fields(hf, arch, fields["num_layers"]),
        **moe_fields(hf, "num_experts", width, experts=384, per_token=6),
    )


FAMILY = Family("kolibri1", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                required=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"))
