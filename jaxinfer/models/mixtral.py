"""Mixtral: the Mistral layer with its MLP replaced by routed experts (`models.moe`).

Every layer routes each token to `num_experts_per_tok` of `num_local_experts` experts, their
weights renormalised to sum to 1; a `sliding_window`, when set, applies to every layer.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.moe import MoELayerWeights, abstract_moe_layer, experts_hf_leaves, moe_decoder_layer
from jaxinfer.models.self_attention import attention_hf_leaves

ARCHITECTURES = ("MixtralForCausalLM",)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> MoELayerWeights:
    """One layer's leaves as ArrayInfos (every Mixtral layer is an MoE layer)."""
    return abstract_moe_layer(cfg)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in an HF checkpoint (w1 = gate, w3 = up, w2 = down)."""
    D, E, moe = cfg.hidden_size, cfg.num_experts, "model.layers.{i}.block_sparse_moe."
    return {
        "attn_norm": HFLeaf("model.layers.{i}.input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf("model.layers.{i}.post_attention_layernorm.weight", "same", (D,)),
        "router": HFLeaf(moe + "gate.weight", "transpose", (E, D)),
        **attention_hf_leaves(cfg),
        **experts_hf_leaves(cfg, moe + "experts.", ("w1", "w3", "w2")),
    }


def moe_fields(hf: Mapping[str, Any], experts_key: str, intermediate: int, experts: int = 8,
               per_token: int = 2) -> dict[str, Any]:
    """The routing fields of an MoE config, checked (the count of experts under `experts_key`); `experts`
    and `per_token` are transformers' defaults for the family (Mixtral's: 8 and 2) where the config has none."""
    experts = int(field(hf, experts_key, field(hf, "num_local_experts", experts)))
    if experts < 1:
        raise ConfigError(f"{experts_key} {experts} must be >= 1 for a mixture-of-experts model")
    return dict(num_experts=experts, experts_per_token=int(field(hf, "num_experts_per_tok", per_token)),
                moe_intermediate_size=intermediate)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Mixtral HF config."""
    fields = common_fields(hf, arch)
    return ModelConfig(
        **fields,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], int(field(hf, "sliding_window", 0))),
        norm_topk_prob=True,
        **moe_fields(hf, "num_local_experts", fields["intermediate_size"]),
    )


FAMILY = Family("mixtral", ARCHITECTURES, read_config, abstract_layer, hf_leaves, moe_decoder_layer)
