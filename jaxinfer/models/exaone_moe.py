"""LG AI Research K-EXAONE (ExaoneMoeForCausalLM: K-EXAONE-236B-A23B): EXAONE 4.0's attention in GLM-4.5's MoE layer.

What changes from EXAONE 4.0 (`exaone4`): the layer is pre-norm (`input_layernorm` before attention,
`post_attention_layernorm` before the MLP, OLMoE's), not OLMo 2's post-norm, and its MLP is dense where
`mlp_layer_types` says "dense" (else the first `first_k_dense_replace` layers), elsewhere DeepSeek-V3's routed
experts: grouped sigmoid routing with `e_score_correction_bias` for choosing only, renormalised, times
`routed_scaling_factor`, plus `num_shared_experts` x `moe_intermediate_size` of shared experts. That layer and its
tensor names are GLM-4.5's (`glm4_moe`); the attention is EXAONE 4.0's (per-head q/k RMSNorms before the rotary
embedding, sliding layers by `layer_types` / `sliding_window_pattern`, rotary on the sliding layers only when a
window is set: `exaone4.attention_fields`). The correction bias is stored beside the router, not in it. The
multi-token-prediction module (`mtp.*`) is not read.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields
from jaxinfer.models.exaone4 import attention_fields
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm4_moe import abstract_layer, decoder_layer, routing_fields
from jaxinfer.models.glm4_moe import hf_leaves as glm4_moe_hf_leaves

ARCHITECTURES = ("ExaoneMoeForCausalLM",)
# ExaoneMoeConfig's defaults for fields a config leaves out (a null sliding_window stays null: no sliding layers).
HF_DEFAULTS = dict(num_key_value_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-5, bos_token_id=1,
                   eos_token_id=53, pad_token_id=0, sliding_window=4096, sliding_window_pattern=4,
                   first_k_dense_replace=1, moe_intermediate_size=1024, num_experts=64, num_experts_per_tok=8,
                   num_shared_experts=1, norm_topk_prob=True, routed_scaling_factor=2.5, n_group=1, topk_group=1)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """GLM-4.5's names, but the correction bias beside the router (`mlp.e_score_correction_bias`, as stored;
    transformers moves it into `mlp.gate`)."""
    bias = HFLeaf("model.layers.{i}.mlp.e_score_correction_bias", "same", (cfg.num_experts,))
    return {**glm4_moe_hf_leaves(cfg), "score_correction": bias}


def dense_layers(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """The dense-MLP layers: `mlp_layer_types` where listed (transformers prefers it), else the first
    `first_k_dense_replace`."""
    kinds = hf.get("mlp_layer_types")
    if kinds is None:
        return tuple(range(min(int(hf["first_k_dense_replace"]), num_layers)))
    if len(kinds) != num_layers or not set(kinds) <= {"dense", "sparse"}:
        raise ConfigError(f"mlp_layer_types {kinds!r} must list 'dense' or 'sparse' for each of the {num_layers} "
                          "layers")
    return tuple(i for i, kind in enumerate(kinds) if kind == "dense")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a K-EXAONE HF config (fields it leaves out take ExaoneMoeConfig's defaults)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None or key == "sliding_window"}}
    fields = common_fields(hf, arch)
    layers = fields["num_layers"]
    if int(hf["num_shared_experts"]) < 1:
        raise ConfigError(f"num_shared_experts {hf['num_shared_experts']} is not supported for {arch}: >= 1 (every "
                          "released checkpoint has a shared expert)")
    # GLM-4.5's routing fields under EXAONE's names
    moe = routing_fields({**hf, "n_routed_experts": hf["num_experts"], "n_shared_experts": hf["num_shared_experts"]},
                         layers)
    return ModelConfig(
        **fields,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        **attention_fields(hf, arch, layers),
        **{**moe, "dense_layers": dense_layers(hf, layers)},
    )


FAMILY = Family("exaone_moe", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
