"""MiniMax-M2 and M2.1 (MiniMaxM2ForCausalLM: 230B-A10B): Mixtral's layer and names with sigmoid routing.

Every layer is a pre-norm MoE layer. The router (float32, as vLLM keeps it) scores each of `num_local_experts`
experts by sigmoid(logit); the top `num_experts_per_tok` of score + `e_score_correction_bias` are chosen and
weighted by their unbiased scores renormalised to sum to 1: GLM-4.5's routing (`models.grouped_topk`) with one
group, no scaling and no shared experts, so the layer is `glm4_moe`'s. Attention: the q and k RMSNorms span the
whole projection, all heads at once (`qk_norm_type` "per_layer", OLMo 2's `cfg.qk_norm_whole`), before the
rotary embedding turns the leading `rotary_dim` dims of each head (rotate-half). The checkpoint keeps Mixtral's
names (`block_sparse_moe.gate`, `experts.{e}.w1/w2/w3`) and stores `num_mtp_modules` multi-token-prediction
layers after the decoder's, which are not run.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm import rotary_dim
from jaxinfer.models.glm4_moe import abstract_layer, decoder_layer
from jaxinfer.models.mixtral import hf_leaves as mixtral_hf_leaves
from jaxinfer.models.mixtral import moe_fields

ARCHITECTURES = ("MiniMaxM2ForCausalLM",)
# MiniMaxM2Config's defaults for fields a config leaves out (or nulls) where common_fields' differ.
DEFAULTS = dict(num_key_value_heads=8, head_dim=128, rope_theta=5e6, max_position_embeddings=196608,
                bos_token_id=200034, eos_token_id=200020, num_local_experts=256, num_experts_per_tok=8)
# Settings of the released checkpoints that transformers' MiniMaxM2 hard-codes: field -> the one value it runs.
FIXED = dict(scoring_func="sigmoid", use_routing_bias=True, use_qk_norm=True, qk_norm_type="per_layer",
             attention_bias=False, shared_intermediate_size=0)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Mixtral's names (`block_sparse_moe.*`, whole-projection q/k norms) and the routing correction bias."""
    bias = "model.layers.{i}.block_sparse_moe.e_score_correction_bias"
    return {**mixtral_hf_leaves(cfg), "score_correction": HFLeaf(bias, "same", (cfg.num_experts,))}


def check_fixed(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse a setting transformers' MiniMaxM2 does not run (it reads none of these fields), naming it."""
    for key, value in FIXED.items():
        if field(hf, key, value) != value:
            raise ConfigError(f"{key} {hf[key]!r} is not supported for {arch}: {value!r} only (the one "
                              "transformers' MiniMaxM2ForCausalLM runs, as every released checkpoint sets)")
    kinds = field(hf, "attn_type_list", [])
    if any(kind != 1 for kind in kinds):
        raise ConfigError(f"attn_type_list {kinds!r} is not supported for {arch}: 1 (softmax attention) in every "
                          "layer; 0 is MiniMax-Text-01's lightning attention")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a MiniMax-M2 HF config (fields it leaves out or nulls take MiniMaxM2Config's defaults)."""
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    check_fixed(hf, arch)
    fields = common_fields(hf, arch)
    head_dim = fields["head_dim"]
    # transformers' order: a partial_rotary_factor (in the rope parameters or at the top), else the legacy rotary_dim
    factor = field(hf, "partial_rotary_factor", field(hf, "rotary_dim", head_dim) / head_dim)
    return ModelConfig(
        **fields,
        rotary_dim=rotary_dim({**hf, "partial_rotary_factor": factor}, head_dim),
        qk_norm=True,
        qk_norm_whole=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        norm_topk_prob=True,
        mtp_layers=int(field(hf, "num_mtp_modules", 0)),
        **moe_fields(hf, "num_local_experts", fields["intermediate_size"], experts=256, per_token=8),
    )


FAMILY = Family("minimax_m2", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
