"""Tencent Hy3 (HYV3ForCausalLM: Hy3-preview): Qwen3's attention over GLM-4.5's MoE layer, one expert group.

As transformers' modeling_hy_v3 has it: attention is Apertus' (per-head q/k RMSNorms before the rotary embedding,
q/k/v/o biased by `attention_bias`); each layer's MLP is dense or sparse by `mlp_layer_types` (by default the
first layer dense). A sparse layer routes DeepSeek-V3's way with one group (`models.glm4_moe`): float32 sigmoid
scores of `num_experts`, the top `num_experts_per_tok` of score + `expert_bias` chosen, their unbiased scores
renormalised (+1e-20) and scaled by `router_scaling_factor`, beside a gated shared MLP of num_shared_experts x
moe_intermediate_size. `enable_moe_fp32_combine` adds the routed and shared outputs in float32 before the cast,
which rounds as adding them in the model's dtype does (both addends are already in it), so either value runs.
The checkpoint's names are HF's hy_v3 conversion's: `mlp.router.gate`, `mlp.expert_bias`, `mlp.shared_mlp`,
per-expert `mlp.experts.{e}.*_proj`; the multi-token-prediction layer stored after the decoder's is not read.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm4_moe import abstract_layer, decoder_layer
from jaxinfer.models.qwen3_moe import hf_leaves as qwen3_moe_hf_leaves
from jaxinfer.models.shared_expert import shared_expert_hf_leaves

ARCHITECTURES = ("HYV3ForCausalLM",)
# HYV3Config's defaults for the fields a config may leave out (or null) where ours differ.
HF_DEFAULTS = dict(vocab_size=120832, intermediate_size=13312, num_key_value_heads=8, head_dim=128,
                   rms_norm_eps=1e-5, max_position_embeddings=131072, rope_theta=11_158_840.0, attention_bias=False,
                   num_experts=192, num_experts_per_tok=8, num_shared_experts=1, moe_intermediate_size=1536,
                   router_scaling_factor=2.826)
MLP_TYPES = ("dense", "sparse")


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Qwen3-MoE's names (norms, attention, dense MLP, per-expert tensors) with Hy3's router, bias and shared MLP."""
    mlp = "model.layers.{i}.mlp."
    return {
        **qwen3_moe_hf_leaves(cfg),
        "router": HFLeaf(mlp + "router.gate.weight", "transpose", (cfg.num_experts, cfg.hidden_size)),
        "score_correction": HFLeaf(mlp + "expert_bias", "same", (cfg.num_experts,)),
        **shared_expert_hf_leaves(cfg, mlp, "shared_mlp.", gated=False),
    }


def dense_layers(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """The layers `mlp_layer_types` marks "dense" (HYV3Config's default: the first one)."""
    kinds = hf.get("mlp_layer_types") or ["dense"] + ["sparse"] * (num_layers - 1)
    if len(kinds) != num_layers or not set(kinds) <= set(MLP_TYPES):
        raise ConfigError(f"mlp_layer_types {kinds!r} must give one of {list(MLP_TYPES)} for each of the "
                          f"{num_layers} layers of {ARCHITECTURES[0]}")
    return tuple(i for i, kind in enumerate(kinds) if kind == "dense")


def routing_fields(hf: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """The sparse layers' experts, top k (always renormalised, then scaled) and shared MLP, checked."""
    experts, per_token, shared = int(hf["num_experts"]), int(hf["num_experts_per_tok"]), int(hf["num_shared_experts"])
    if not 1 <= per_token <= experts:
        raise ConfigError(f"num_experts_per_tok {per_token} must be in [1, num_experts ({experts})] for "
                          f"{ARCHITECTURES[0]}")
    if shared < 1:
        raise ConfigError(f"num_shared_experts {shared} is not supported for {ARCHITECTURES[0]}: >= 1 only "
                          "(transformers builds the shared MLP in every sparse layer)")
    width, scale = int(hf["moe_intermediate_size"]), float(hf["router_scaling_factor"])
    return dict(num_experts=experts, experts_per_token=per_token, moe_intermediate_size=width, norm_topk_prob=True,
                routed_scaling_factor=scale, shared_expert_intermediate_size=shared * width,
                dense_layers=dense_layers(hf, num_layers))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Hy3 HF config (fields it leaves out or nulls take HYV3Config's defaults)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    fields = common_fields(hf, arch)
    bias = bool(hf["attention_bias"])
    return ModelConfig(
        **fields,
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        **routing_fields(hf, fields["num_layers"]),
    )


FAMILY = Family("hy_v3", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
