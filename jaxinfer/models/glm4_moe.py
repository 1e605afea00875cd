"""GLM-4.5 and GLM-4.6 (Glm4MoeForCausalLM): a pre-norm MoE decoder with DeepSeek-V3's grouped sigmoid routing.

The first `first_k_dense_replace` layers keep a dense MLP of `intermediate_size`. Every later one routes
each token to `num_experts_per_tok` of `n_routed_experts` experts by `models.grouped_topk` (sigmoid scores,
`e_score_correction_bias` for choosing only, `n_group` / `topk_group` groups, `routed_scaling_factor`);
the router and the bias stay float32 as transformers keeps them, so a bf16 model chooses the experts it
would in float32. Beside them, ungated shared experts: one dense MLP of n_shared_experts x
moe_intermediate_size (`models.shared_expert`). Attention has q/k/v biases with `attention_bias` (never
an o bias), per-head q/k RMSNorms with `use_qk_norm`, and rotary embeddings on the leading
`partial_rotary_factor` of each head (0.5 unless set) in the rotate-half layout. Checkpoints store
multi-token-prediction layers after the decoder's (`num_nextn_predict_layers`): the decoder skips them,
speculative decoding can draft with the first (`speculative.mtp`, method "mtp").
MiniMax-M2 (`models.minimax_m2`) runs this MoE layer with one group and no shared experts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm import rotary_dim
from jaxinfer.models.grouped_topk import check_groups, grouped_topk
from jaxinfer.models.layers import linear
from jaxinfer.models.llama import abstract_layer as dense_leaves
from jaxinfer.models.llama import decoder_layer as dense_layer
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.moe import ROUTER_AXES, abstract_moe_layer, experts_output, is_dense, pre_norm_layer
from jaxinfer.models.qwen3_moe import hf_leaves as qwen3_moe_hf_leaves
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.shared_expert import (
    SharedExpertLayerWeights,
    abstract_shared_moe_layer,
    shared_expert,
    shared_expert_hf_leaves,
)
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("Glm4MoeForCausalLM",)
# transformers' Glm4MoeConfig defaults for the fields a config may leave out (or null) that differ from ours.
HF_DEFAULTS = dict(rms_norm_eps=1e-5, max_position_embeddings=131072, moe_intermediate_size=1408, n_shared_experts=1,
                   n_group=1, topk_group=1, routed_scaling_factor=1.0, first_k_dense_replace=1, norm_topk_prob=True,
                   use_qk_norm=False, attention_bias=False)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Glm4MoeLayerWeights(SharedExpertLayerWeights):
    """An MoE layer with ungated shared experts and a float32 router (fields default to None as the parent's do)."""

    score_correction: jax.Array | None = None  # [E] float32: e_score_correction_bias, added for choosing only


def abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """One layer's leaves as ArrayInfos: routed and shared experts (none where their size is 0), or a dense MLP
    in `dense_layers`."""
    if not cfg.is_moe_layer(layer):
        return dense_leaves(cfg, layer)
    routed = abstract_shared_moe_layer(cfg, gated=False) if cfg.shared_expert_intermediate_size else \
        abstract_moe_layer(cfg)
    D, E = cfg.hidden_size, cfg.num_experts
    return Glm4MoeLayerWeights(
        **{**{f.name: getattr(routed, f.name) for f in dataclasses.fields(routed)},
           "router": ArrayInfo((D, E), ROUTER_AXES, dtype="float32")},
        score_correction=ArrayInfo((E,), (None,), init_value=0.0, dtype="float32"),
    )


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Qwen3-MoE's names (norms, router, attention, dense MLP, experts), the correction bias and the shared experts."""
    mlp = "model.layers.{i}.mlp."
    return {
        **qwen3_moe_hf_leaves(cfg),
        "score_correction": HFLeaf(mlp + "gate.e_score_correction_bias", "same", (cfg.num_experts,)),
        **shared_expert_hf_leaves(cfg, mlp, "shared_experts.", gated=False),
    }


def moe_block(x: jax.Array, lw: Glm4MoeLayerWeights, cfg: ModelConfig, layout: Layout, epsilon: float = 1e-20
              ) -> jax.Array:
    """The routed experts' output plus any shared experts' for x [B, T, D], in x's dtype (`epsilon`: grouped_topk's
    renormalising one, LFM2-MoE's 1e-6)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    logits = linear(x2.astype(jnp.float32), lw.router)  # float32 rows and router, as transformers computes them
    weights, experts = grouped_topk(logits, lw.score_correction, cfg.experts_per_token, cfg.expert_groups,
                                    cfg.expert_groups_per_token, cfg.norm_topk_prob, cfg.routed_scaling_factor, epsilon)
    routed = experts_output(x2, weights, experts, lw, layout, cfg.activation).astype(x.dtype).reshape(shape)
    return routed if lw.shared_gate is None else routed + shared_expert(x, lw, cfg.activation)


def decoder_layer(cfg: ModelConfig, x, cache, lw, layer: int, positions, rope: RopeTables):
    """The MoE layer, or the Llama layer (with GLM's attention options) where the MLP is dense."""
    if is_dense(lw):
        return dense_layer(cfg, x, cache, lw, layer, positions, rope)
    return pre_norm_layer(cfg, x, cache, lw, layer, positions, rope, lambda h, layout: moe_block(h, lw, cfg, layout))


def routing_fields(hf: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """The MoE fields of a GLM-4.5-style config (its defaults filled in): routed and shared experts, DeepSeek-V3's
    grouping and scaling, and the first `first_k_dense_replace` layers dense (dots.llm1, Solar Open and Sarvam-MoE
    read theirs here too)."""
    moe = moe_fields(hf, "n_routed_experts", int(hf["moe_intermediate_size"]), experts=128, per_token=8)
    shared = int(hf["n_shared_experts"])
    if shared < 1:
        raise ConfigError(f"n_shared_experts {shared} must be >= 1 (every released checkpoint has a shared expert)")
    groups, groups_per_token = int(hf["n_group"]), int(hf["topk_group"])
    check_groups(moe["num_experts"], groups, groups_per_token, moe["experts_per_token"])
    return dict(
        norm_topk_prob=bool(hf["norm_topk_prob"]),
        dense_layers=tuple(range(min(int(hf["first_k_dense_replace"]), num_layers))),
        shared_expert_intermediate_size=shared * moe["moe_intermediate_size"],
        expert_groups=groups,
        expert_groups_per_token=groups_per_token,
        routed_scaling_factor=float(hf["routed_scaling_factor"]),
        **moe,
    )


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a GLM-4.5 / GLM-4.6 HF config (fields it leaves out or nulls take Glm4MoeConfig's defaults)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    fields = common_fields(hf, arch)
    bias = bool(hf["attention_bias"])
    return ModelConfig(
        **fields,
        rotary_dim=rotary_dim(hf, fields["head_dim"]),
        qkv_bias=bias,
        qk_norm=bool(hf["use_qk_norm"]),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        mtp_layers=int(field(hf, "num_nextn_predict_layers", field(hf, "num_mtp_layers", 1))),
        **routing_fields(hf, fields["num_layers"]),
    )


FAMILY = Family("glm4_moe", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
