"""rednote's dots.llm1 (Dots1ForCausalLM: 142B-A14B): Qwen3's attention over GLM-4.5's MoE layer.

Attention is Qwen3's: per-head q/k RMSNorms before the rotary embedding (over the whole head), q/k/v and o
biases with `attention_bias`, and a `sliding_window` on the layers `layer_types` marks sliding (transformers'
default list: from `max_window_layers` on whenever `sliding_window` is set). The MLP is DeepSeek-V3's, the one
`glm4_moe` runs: the first `first_k_dense_replace` layers dense, the others routing to `num_experts_per_tok` of
`n_routed_experts` experts by sigmoid score with `e_score_correction_bias` added for choosing only, within the
best `topk_group` of `n_group` groups, renormalised with `norm_topk_prob` and scaled by `routed_scaling_factor`,
plus ungated shared experts of n_shared_experts x moe_intermediate_size. The checkpoint's names are GLM-4.5's.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import REQUIRED_FIELDS, ModelConfig, activation_name, common_fields, layer_types
from jaxinfer.models.family import Family
from jaxinfer.models.glm4_moe import abstract_layer, decoder_layer, hf_leaves, routing_fields

ARCHITECTURES = ("Dots1ForCausalLM",)
# Dots1Config's defaults for the fields a config may leave out (or null) that differ from ours; it has none for the
# experts' counts (`REQUIRED`).
HF_DEFAULTS = dict(num_key_value_heads=32, max_position_embeddings=2048, moe_intermediate_size=1408, n_group=1,
                   topk_group=1, first_k_dense_replace=0, norm_topk_prob=False, routed_scaling_factor=1.0,
                   attention_bias=False, max_window_layers=62)
REQUIRED = (*REQUIRED_FIELDS, "n_routed_experts", "n_shared_experts", "num_experts_per_tok")


def layer_windows(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """Each layer's window as transformers' Dots1 reads them: `layer_types`, else sliding from `max_window_layers`
    on; a sliding layer slides over `sliding_window` (no `use_sliding_window` switch, unlike Qwen3's)."""
    window = int(hf.get("sliding_window") or 0)
    start = int(hf["max_window_layers"])
    types = layer_types(hf, num_layers) or ["sliding_attention" if window and i >= start else "full_attention"
                                            for i in range(num_layers)]
    return tuple(window if kind == "sliding_attention" else 0 for kind in types)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a dots.llm1 HF config (fields it leaves out or nulls take Dots1Config's defaults)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    fields = common_fields(hf, arch)
    bias = bool(hf["attention_bias"])
    return ModelConfig(
        **fields,
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=layer_windows(hf, fields["num_layers"]),
        **routing_fields(hf, fields["num_layers"]),
    )


FAMILY = Family("dots1", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer, required=REQUIRED)
