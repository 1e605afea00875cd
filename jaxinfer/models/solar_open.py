"""Upstage Solar Open (SolarOpenForCausalLM: Solar-Open-100B): GLM-4.5's MoE layer in every layer, Llama's attention.

Every layer routes (no dense first layers): DeepSeek-V3's grouped sigmoid routing with `e_score_correction_bias`
for choosing only, renormalised with `norm_topk_prob`, times `routed_scaling_factor`, plus ungated shared experts
(`glm4_moe`'s layer and tensor names). Attention is Llama's: q/k/v biases with `attention_bias` (never o's), no
q/k norms, rotary over the whole head unless `partial_rotary_factor` says otherwise. SolarOpenConfig drops GLM-4.5's
`intermediate_size`, `first_k_dense_replace` and `use_qk_norm`; a config setting the last two to what transformers
would not run (dense layers, q/k norms) is refused by name.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family
from jaxinfer.models.glm import rotary_dim
from jaxinfer.models.glm4_moe import abstract_layer, decoder_layer, hf_leaves, routing_fields

ARCHITECTURES = ("SolarOpenForCausalLM",)
# SolarOpenConfig's defaults for the fields a config may leave out (or null); no dense layers, so no dense width.
HF_DEFAULTS = dict(num_key_value_heads=8, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-5,
                   max_position_embeddings=131072, moe_intermediate_size=1280, num_experts_per_tok=8,
                   n_routed_experts=128, n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=1.0,
                   norm_topk_prob=True, attention_bias=False, partial_rotary_factor=1.0)
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def check_dropped(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse GLM-4.5 settings SolarOpenConfig drops (transformers runs every layer routed, without q/k norms)."""
    if int(field(hf, "first_k_dense_replace", 0)):
        raise ConfigError(f"first_k_dense_replace {hf['first_k_dense_replace']!r} is not supported for {arch}: 0 only "
                          "(transformers' SolarOpen routes every layer)")
    if field(hf, "use_qk_norm", False):
        raise ConfigError(f"use_qk_norm {hf['use_qk_norm']!r} is not supported for {arch}: false only "
                          "(transformers' SolarOpen attention is Llama's, without q/k norms)")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Solar Open HF config (fields it leaves out or nulls take SolarOpenConfig's defaults)."""
    check_dropped(hf, arch)
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}, "intermediate_size": 0,
          "first_k_dense_replace": 0}
    fields = common_fields(hf, arch)
    return ModelConfig(
        **fields,
        rotary_dim=rotary_dim(hf, fields["head_dim"]),
        qkv_bias=bool(hf["attention_bias"]),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        mtp_layers=int(field(hf, "num_nextn_predict_layers", 0)),
        **routing_fields(hf, fields["num_layers"]),
    )


FAMILY = Family("solar_open", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer, required=REQUIRED)
