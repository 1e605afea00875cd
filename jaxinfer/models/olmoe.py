"""OLMoE (OlmoeForCausalLM: AI2's OLMoE-1B-7B): the pre-norm MoE layer with OLMo 2's q/k norms.

Every layer routes each token to `num_experts_per_tok` (8) of `num_experts` (64) experts of
`intermediate_size` hidden units by softmax, renormalising the chosen weights only with
`norm_topk_prob` (Qwen3-MoE's router, `models.moe`). The q/k RMSNorms span all heads' dims at
once (`cfg.qk_norm_whole`, as OLMo 2's), so heads must be hidden_size / num_attention_heads wide,
as transformers builds them. Fields a config leaves out take transformers' OlmoeConfig defaults.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.moe import MoELayerWeights, abstract_moe_layer, experts_hf_leaves, moe_decoder_layer
from jaxinfer.models.self_attention import attention_hf_leaves

ARCHITECTURES = ("OlmoeForCausalLM",)
# OlmoeConfig's defaults for fields a config leaves out (where common_fields' differ).
DEFAULTS = dict(rms_norm_eps=1e-5, eos_token_id=50279)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> MoELayerWeights:
    """One layer's leaves as ArrayInfos (every OLMoE layer routes to experts)."""
    return abstract_moe_layer(cfg)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: Qwen3-MoE's names (`mlp.gate`, `mlp.experts.{e}.*_proj`)."""
    D, E, mlp = cfg.hidden_size, cfg.num_experts, "model.layers.{i}.mlp."
    return {
        "attn_norm": HFLeaf("model.layers.{i}.input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf("model.layers.{i}.post_attention_layernorm.weight", "same", (D,)),
        "router": HFLeaf(mlp + "gate.weight", "transpose", (E, D)),
        **attention_hf_leaves(cfg),
        **experts_hf_leaves(cfg, mlp + "experts.", ("gate_proj", "up_proj", "down_proj")),
    }


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an OLMoE HF config."""
    return moe_config({**DEFAULTS, **hf}, arch, experts=64, per_token=8)


def moe_config(hf: Mapping[str, Any], arch: str, experts: int, per_token: int) -> ModelConfig:
    """ModelConfig of OLMoE's layer (FlexOlmo's too): one q and one k norm over all heads, routed experts
    (`experts` and `per_token` the family's defaults)."""
    fields = common_fields(hf, arch)
    if hf.get("clip_qkv") is not None:
        raise ConfigError(f"clip_qkv {hf['clip_qkv']!r} is not supported for {arch}: null only (no clamp of q, k "
                          "and v; the released checkpoints set none)")
    if fields["head_dim"] * fields["num_heads"] != fields["hidden_size"]:
        raise ConfigError(f"head_dim {fields['head_dim']} is not supported for {arch}: its q/k norms span "
                          f"hidden_size {fields['hidden_size']}, so heads are hidden_size / num_attention_heads "
                          f"({fields['hidden_size'] // fields['num_heads']}) wide")
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **fields,
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        qk_norm_whole=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        **moe_fields(hf, "num_experts", fields["intermediate_size"], experts=experts, per_token=per_token),
    )


FAMILY = Family("olmoe", ARCHITECTURES, read_config, abstract_layer, hf_leaves, moe_decoder_layer)
