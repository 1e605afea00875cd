"""Mistral Small 4 (Mistral4ForCausalLM): DeepSeek-V3's latent attention and MoE with Llama 4's query temperature.

transformers builds the layer from DeepSeek-V3's (`models.deepseek`: a low-rank query, one compressed row cached
per token, ungated shared experts beside the routed ones, the first `first_k_dense_replace` layers dense). What
differs:

- The router (Mistral4TopkRouter): softmax scores over the experts, groups ranked by their two best, the top k
  within the best `topk_group` of `n_group`, renormalised with norm_topk_prob, times routed_scaling_factor; no
  correction bias (`models.grouped_topk` with `softmax`). It runs in float32 here (transformers runs it in the
  model's dtype), so a bf16 model chooses the experts its float32 weights would.
- The query: after the rotary embedding it is scaled by 1 + beta * log(1 + floor(position / original)), beta being
  `rope_parameters.llama_4_scaling_beta` and original its original_max_position_embeddings (as Ministral 3's).
- The rope: Llama's rotary embedding over head_dim (qk_nope_head_dim + qk_rope_head_dim) times the
  partial_rotary_factor Mistral4Config sets (qk_rope_head_dim / head_dim), so over the qk_rope_head_dim dims;
  a config without rope parameters takes Mistral4Config's (YaRN x128 over 8192 positions, beta 0.1).
- The checkpoint holds each layer's experts as two tensors (gate_up_proj, down_proj), as transformers saves them.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.deepseek import (
    KEPT_NULL,
    DeepseekMoELayerWeights,
    abstract_layer,
    decoder_layer,
    grouped_fields,
    hf_leaves,
    latent_fields,
)
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.grouped_topk import grouped_topk
from jaxinfer.models.ministral3 import query_scale_beta, rope_parameters
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.qwen3_5 import fused_experts_hf_leaves

ARCHITECTURES = ("Mistral4ForCausalLM",)
# Mistral4Config's defaults for the fields a config may leave out (or null).
HF_DEFAULTS = dict(moe_intermediate_size=2048, n_shared_experts=1, n_routed_experts=128, routed_scaling_factor=1.0,
                   kv_lora_rank=256, q_lora_rank=1024, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=64,
                   n_group=1, topk_group=1, num_experts_per_tok=4, first_k_dense_replace=0, norm_topk_prob=True,
                   max_position_embeddings=1048576, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
                   rope_interleave=True)
DEFAULT_ROPE = dict(rope_type="yarn", rope_theta=10000.0, factor=128.0, original_max_position_embeddings=8192,
                    beta_fast=32.0, beta_slow=1.0, mscale_all_dim=1.0, mscale=1.0, llama_4_scaling_beta=0.1)


def route(logits: jax.Array, lw: DeepseekMoELayerWeights, cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """Mistral4TopkRouter's weights [N, k] and experts [N, k]: softmax scores, grouped, no correction bias."""
    return grouped_topk(logits, None, cfg.experts_per_token, cfg.expert_groups, cfg.expert_groups_per_token,
                        cfg.norm_topk_prob, cfg.routed_scaling_factor, softmax=True)


def _hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """DeepSeek-V3's tensor names, the experts fused: gate_up_proj [E, 2F, D] and down_proj [E, D, F]."""
    return {**hf_leaves(cfg), **fused_experts_hf_leaves(cfg, "model.layers.{i}.mlp.experts.")}


def _check_rotary(params: Mapping[str, Any], hf: Mapping[str, Any], arch: str) -> None:
    """Refuse a partial_rotary_factor whose rotated dims (int(head_dim * factor), as transformers' rope counts
    them) are not the qk_rope_head_dim dims the latent attention turns."""
    nope, rope = int(hf["qk_nope_head_dim"]), int(hf["qk_rope_head_dim"])
    fraction = params.get("partial_rotary_factor", rope / (nope + rope))
    if int((nope + rope) * fraction) != rope:
        raise ConfigError(f"partial_rotary_factor {fraction} is not supported for {arch}: it must turn the "
                          f"qk_rope_head_dim {rope} of each {nope + rope}-dim head ({rope / (nope + rope)})")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Mistral 4 HF config (fields it leaves out or nulls take Mistral4Config's defaults; a null
    q_lora_rank means a plain q_proj)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None or key in KEPT_NULL}}
    params = rope_parameters(hf, DEFAULT_ROPE)
    _check_rotary(params, hf, arch)
    fields = common_fields({**hf, "rope_parameters": params, "rope_scaling": None}, arch)
    scaling = fields["rope_scaling"]
    moe = moe_fields(hf, "n_routed_experts", int(hf["moe_intermediate_size"]))
    return ModelConfig(
        **latent_fields(hf, fields, bool(hf["rope_interleave"])),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        dense_layers=tuple(range(min(int(hf["first_k_dense_replace"]), fields["num_layers"]))),
        query_scale_beta=query_scale_beta(params, scaling.rope_type, arch),
        query_scale_period=scaling.original_max_position_embeddings,
        **grouped_fields(hf, arch, moe),
        **moe,
    )


FAMILY = Family("mistral4", ARCHITECTURES, read_config, abstract_layer, _hf_leaves,
                functools.partial(decoder_layer, router=route))
