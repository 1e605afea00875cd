"""Config reading of the MoE families built from GLM-4.5's layer and others' attention (dots.llm1, HunYuan, Solar
Open, Sarvam-MoE): each field as transformers reads it, and the settings not run refused by name. No model runs."""

from __future__ import annotations

import pytest
import transformers

from jaxinfer import ConfigError, from_hf_config

SHAPE = dict(vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=4, num_attention_heads=2)
DOTS1 = dict(SHAPE, architectures=["Dots1ForCausalLM"], num_key_value_heads=1, n_routed_experts=8, n_shared_experts=2,
             num_experts_per_tok=3)


@pytest.mark.parametrize("fields", [
    {},
    dict(n_group=4, topk_group=2, first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5,
         attention_bias=True, sliding_window=4, max_window_layers=2),
    dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"] * 2),
])
def test_dots1_fields_read_as_transformers_reads_them(fields):
    ours = from_hf_config({**DOTS1, **fields})
    theirs = transformers.Dots1Config(**{**DOTS1, **fields})
    assert (ours.num_experts, ours.experts_per_token, ours.moe_intermediate_size) == (
        theirs.n_routed_experts, theirs.num_experts_per_tok, theirs.moe_intermediate_size)
    assert ours.shared_expert_intermediate_size == theirs.n_shared_experts * theirs.moe_intermediate_size
    assert (ours.expert_groups, ours.expert_groups_per_token, ours.routed_scaling_factor, ours.norm_topk_prob) == (
        theirs.n_group, theirs.topk_group, theirs.routed_scaling_factor, theirs.norm_topk_prob)
    assert ours.dense_layers == tuple(range(theirs.first_k_dense_replace))
    assert (ours.qkv_bias, ours.o_bias, ours.qk_norm, ours.rotated_dims) == (
        theirs.attention_bias, theirs.attention_bias, True, ours.head_dim)
    assert ours.layer_windows == tuple(theirs.sliding_window if kind == "sliding_attention" else 0
                                       for kind in theirs.layer_types)
    assert (ours.num_kv_heads, ours.rms_norm_eps, ours.max_position_embeddings, ours.rope_theta) == (
        theirs.num_key_value_heads, theirs.rms_norm_eps, theirs.max_position_embeddings,
        theirs.rope_parameters["rope_theta"])


@pytest.mark.parametrize("fields,message", [
    (dict(n_routed_experts=None), "no n_routed_experts; an HF config of a Dots1ForCausalLM model sets"),
    (dict(n_shared_experts=0), "n_shared_experts 0 must be >= 1"),
    (dict(n_group=3), "n_group 3 must divide the 8 routed experts"),
])
def test_dots1_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**DOTS1, **fields})
