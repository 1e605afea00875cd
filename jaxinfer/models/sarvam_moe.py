"""Sarvam-MoE (SarvamMoEForCausalLM: sarvam-30b): GLM-4.5's model under Sarvam's defaults and tensor names.

transformers runs a `sarvam_moe` checkpoint as Glm4MoeForCausalLM (and saves it under that class name; the registry
reads its `model_type`): the first `first_k_dense_replace` layers dense, then DeepSeek-V3's grouped sigmoid routing
(`expert_bias` added for choosing only, `norm_topk_prob`, `routed_scaling_factor` 2.5) beside ungated shared
experts, per-head q/k RMSNorms before the rotary embedding, q/k/v biases by `use_qkv_bias` / `attention_bias`. What
differs from GLM-4.5: rotary over the whole head (`partial_rotary_factor` 1.0 by default), theta 8e6, and the
checkpoint's names: `model.word_embeddings`, `attention.query_key_value` (q, k and v rows in three blocks),
`attention.dense`, `attention.query_layernorm` / `key_layernorm`, `mlp.gate.expert_bias`. The original config's
names (`num_experts`, `num_shared_experts`, `use_qkv_bias`) are read as transformers' attribute map reads them.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm import rotary_dim
from jaxinfer.models.glm4_moe import abstract_layer, decoder_layer, routing_fields
from jaxinfer.models.glm4_moe import hf_leaves as glm4_moe_hf_leaves

ARCHITECTURE = "SarvamMoEForCausalLM"
MODEL_TYPE = "sarvam_moe"
# The original config's names -> SarvamMoEConfig's (transformers' attribute_map).
ORIGINAL_NAMES = dict(num_experts="n_routed_experts", num_shared_experts="n_shared_experts",
                      use_qkv_bias="attention_bias", num_mtp_layers="num_nextn_predict_layers")
# SarvamMoEConfig's defaults for the fields a config may leave out (or null).
HF_DEFAULTS = dict(num_key_value_heads=4, head_dim=64, rope_theta=8e6, rms_norm_eps=1e-6,
                   max_position_embeddings=131072, moe_intermediate_size=1024, num_experts_per_tok=6,
                   n_routed_experts=128, n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
                   routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True, attention_bias=False,
                   partial_rotary_factor=1.0, num_nextn_predict_layers=0)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """GLM-4.5's names with Sarvam's attention (q, k, v as row blocks of query_key_value) and routing bias."""
    H, KV, K, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    attn, rows = "model.layers.{i}.attention.", (H + 2 * KV) * K
    offsets = dict(q=(H, 0), k=(KV, H * K), v=(KV, (H + KV) * K))  # each block's heads and first row
    leaves = {
        **glm4_moe_hf_leaves(cfg),
        **{f"w{p}": HFLeaf(attn + "query_key_value.weight", "in_heads", (rows, D), heads, K, row_offset=first)
           for p, (heads, first) in offsets.items()},
        "wo": HFLeaf(attn + "dense.weight", "out_heads", (D, H * K), H, K),
        "score_correction": HFLeaf("model.layers.{i}.mlp.gate.expert_bias", "same", (cfg.num_experts,)),
    }
    if cfg.qkv_bias:
        leaves |= {f"b{p}": HFLeaf(attn + "query_key_value.bias", "bias_heads", (rows,), heads, K, row_offset=first)
                   for p, (heads, first) in offsets.items()}
    if cfg.qk_norm:
        leaves |= {"q_norm": HFLeaf(attn + "query_layernorm.weight", "same", (K,)),
                   "k_norm": HFLeaf(attn + "key_layernorm.weight", "same", (K,))}
    return leaves


def canonical(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The config under SarvamMoEConfig's names (a canonical name set beside its original one wins)."""
    out = {ORIGINAL_NAMES.get(key, key): value for key, value in hf.items() if key not in ORIGINAL_NAMES.values()}
    return {**out, **{key: value for key, value in hf.items() if key in ORIGINAL_NAMES.values()}}


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Sarvam-MoE HF config (fields it leaves out or nulls take SarvamMoEConfig's defaults)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in canonical(hf).items() if value is not None}}
    if field(hf, "score_function", "sigmoid") != "sigmoid":
        raise ConfigError(f"score_function {hf['score_function']!r} is not supported for {arch}: 'sigmoid' only "
                          "(transformers runs Sarvam-MoE's router as GLM-4.5's)")
    fields = common_fields(hf, arch)
    return ModelConfig(
        **fields,
        rotary_dim=rotary_dim(hf, fields["head_dim"]),
        qkv_bias=bool(hf["attention_bias"]),
        qk_norm=bool(hf["use_qk_norm"]),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        mtp_layers=int(hf["num_nextn_predict_layers"]),
        **routing_fields(hf, fields["num_layers"]),
    )


FAMILY = Family("sarvam_moe", (ARCHITECTURE,), read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=("model.word_embeddings.weight", "model.norm.weight"))
