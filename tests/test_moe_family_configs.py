"""Config reading of the MoE families built from GLM-4.5's layer and others' attention (dots.llm1, HunYuan, Solar
Open, Sarvam-MoE, Laguna): each field as transformers reads it, and the settings not run refused by name. No model runs."""

from __future__ import annotations

import pytest
import transformers
from hf_models import hf

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


HUNYUAN = dict(SHAPE, num_key_value_heads=1, head_dim=8)
# Hunyuan-A13B's config.json layout (transformers 4's): NTK-alpha as rope_scaling "dynamic", vLLM's per-layer lists
HUNYUAN_A13B = dict(rope_theta=10000.0, rope_scaling=dict(type="dynamic", alpha=1000.0, factor=1.0, beta_fast=32,
                                                          beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
                    num_experts=4, moe_topk=[2] * 4, moe_intermediate_size=[8] * 4, num_shared_expert=[1] * 4,
                    use_mixed_mlp_moe=True, use_qk_norm=True, use_cla=False, attention_head_dim=8)


@pytest.mark.parametrize("arch,fields", [
    ("HunYuanDenseV1ForCausalLM", {}),
    ("HunYuanDenseV1ForCausalLM", dict(rope_parameters=dict(rope_type="dynamic", factor=1.0, alpha=50.0,
                                                           rope_theta=1e4), attention_bias=True)),
    ("HunYuanMoEV1ForCausalLM", dict(num_experts=4, moe_topk=2)),
    ("HunYuanMoEV1ForCausalLM", HUNYUAN_A13B),
])
def test_hunyuan_fields_read_as_transformers_reads_them(arch, fields):
    from transformers.models.hunyuan_v1_moe.modeling_hunyuan_v1_moe import HunYuanMoEV1RotaryEmbedding

    from jaxinfer.models.rope import rope_inv_freq

    ours = from_hf_config({**HUNYUAN, **fields, "architectures": [arch]})
    config_cls = transformers.HunYuanMoEV1Config if "MoE" in arch else transformers.HunYuanDenseV1Config
    theirs = config_cls(**HUNYUAN, **fields)
    inv_freq = HunYuanMoEV1RotaryEmbedding(theirs).inv_freq.numpy()
    assert abs(rope_inv_freq(ours.head_dim, ours.rope_theta, ours.rope_scaling) / inv_freq - 1).max() < 1e-6
    assert (ours.qk_norm, ours.qk_norm_after_rope, ours.qkv_bias, ours.o_bias) == (
        True, True, theirs.attention_bias, theirs.attention_bias)
    assert (ours.num_kv_heads, ours.head_dim, ours.rms_norm_eps, ours.max_position_embeddings) == (
        theirs.num_key_value_heads, theirs.head_dim, theirs.rms_norm_eps, theirs.max_position_embeddings)
    if "MoE" in arch:  # transformers sizes experts and the shared MLP by intermediate_size, as these configs agree
        assert (ours.num_experts, ours.experts_per_token, ours.norm_topk_prob) == (4, 2, True)
        assert ours.moe_intermediate_size == ours.shared_expert_intermediate_size == theirs.intermediate_size
    else:
        assert ours.num_experts == 0


@pytest.mark.parametrize("fields,message", [
    (dict(use_cla=True, cla_share_factor=2), "use_cla True is not supported .* cross-layer attention"),
    (dict(use_qk_norm=False), "use_qk_norm False is not supported"),
    (dict(use_mixed_mlp_moe=False), "use_mixed_mlp_moe False is not supported"),
    (dict(rope_scaling=dict(type="dynamic", factor=2.0)), "rope type 'dynamic' without an alpha is not supported"),
    (dict(moe_topk=[2, 2, 1, 1]), r"moe_topk \[2, 2, 1, 1\] is not supported: one value shared by all 4 layers"),
    (dict(num_experts=1), "num_experts 1 must be >= 2"),
])
def test_hunyuan_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**HUNYUAN, **HUNYUAN_A13B, **fields, "architectures": ["HunYuanMoEV1ForCausalLM"]})


SOLAR = dict(vocab_size=8, hidden_size=16, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
             architectures=["SolarOpenForCausalLM"])


@pytest.mark.parametrize("fields", [
    {},
    dict(head_dim=8, partial_rotary_factor=0.5, attention_bias=True, n_routed_experts=8, n_group=4, topk_group=2,
         num_experts_per_tok=3, moe_intermediate_size=4, n_shared_experts=2, routed_scaling_factor=2.5),
    dict(head_dim=8, rope_parameters=dict(rope_type="default", rope_theta=5e4, partial_rotary_factor=0.25),
         intermediate_size=64, first_k_dense_replace=0, use_qk_norm=False),  # dropped fields at the values it runs
])
def test_solar_open_fields_read_as_transformers_reads_them(fields):
    ours = from_hf_config({**SOLAR, **fields})
    theirs = transformers.SolarOpenConfig(**{**SOLAR, **fields})
    rope = theirs.rope_parameters
    assert (ours.num_experts, ours.experts_per_token, ours.moe_intermediate_size) == (
        theirs.n_routed_experts, theirs.num_experts_per_tok, theirs.moe_intermediate_size)
    assert ours.shared_expert_intermediate_size == theirs.n_shared_experts * theirs.moe_intermediate_size
    assert (ours.expert_groups, ours.expert_groups_per_token, ours.routed_scaling_factor, ours.norm_topk_prob) == (
        theirs.n_group, theirs.topk_group, theirs.routed_scaling_factor, theirs.norm_topk_prob)
    assert (ours.dense_layers, ours.qkv_bias, ours.o_bias, ours.qk_norm) == ((), theirs.attention_bias, False, False)
    assert (ours.num_kv_heads, ours.head_dim, ours.rms_norm_eps, ours.max_position_embeddings) == (
        theirs.num_key_value_heads, theirs.head_dim, theirs.rms_norm_eps, theirs.max_position_embeddings)
    assert (ours.rope_theta, ours.rotated_dims) == (
        rope["rope_theta"], int(theirs.head_dim * rope.get("partial_rotary_factor", 1.0)))


@pytest.mark.parametrize("fields,message", [
    (dict(first_k_dense_replace=1), "first_k_dense_replace 1 is not supported for SolarOpenForCausalLM: 0 only"),
    (dict(use_qk_norm=True), "use_qk_norm True is not supported for SolarOpenForCausalLM: false only"),
    (dict(n_group=3), "n_group 3 must divide the 128 routed experts"),
])
def test_solar_open_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**SOLAR, **fields})


SARVAM = dict(SHAPE, num_key_value_heads=1, head_dim=8)
# sarvam-30b's config.json names (transformers' attribute map reads them as n_routed_experts, ...)
SARVAM_30B = dict(architectures=["SarvamMoEForCausalLM"], model_type="sarvam_moe", num_experts=8, num_shared_experts=2,
                  use_qkv_bias=True, num_experts_per_tok=3, moe_intermediate_size=4, score_function="sigmoid")


@pytest.mark.parametrize("fields", [
    SARVAM_30B,
    dict(SARVAM_30B, n_group=4, topk_group=2, first_k_dense_replace=2, routed_scaling_factor=1.5, use_qk_norm=False),
    # as transformers saves it: Glm4MoeForCausalLM's name, the model_type naming the family; rope_parameters written
    dict(architectures=["Glm4MoeForCausalLM"], model_type="sarvam_moe", n_routed_experts=8, n_shared_experts=1,
         rope_parameters=dict(rope_type="default", rope_theta=8e6, partial_rotary_factor=0.5)),
])
def test_sarvam_moe_fields_read_as_transformers_reads_them(fields):
    ours = from_hf_config({**SARVAM, **fields})
    theirs = hf.SarvamMoEConfig(**{**SARVAM, **fields})  # skips where transformers lacks it (5.17)
    rope = theirs.rope_parameters
    assert ours.architecture == "SarvamMoEForCausalLM"
    assert (ours.num_experts, ours.experts_per_token, ours.moe_intermediate_size) == (
        theirs.n_routed_experts, theirs.num_experts_per_tok, theirs.moe_intermediate_size)
    assert ours.shared_expert_intermediate_size == theirs.n_shared_experts * theirs.moe_intermediate_size
    assert (ours.expert_groups, ours.expert_groups_per_token, ours.routed_scaling_factor, ours.norm_topk_prob) == (
        theirs.n_group, theirs.topk_group, theirs.routed_scaling_factor, theirs.norm_topk_prob)
    assert ours.dense_layers == tuple(range(theirs.first_k_dense_replace))
    assert (ours.qkv_bias, ours.o_bias, ours.qk_norm) == (theirs.attention_bias, False, theirs.use_qk_norm)
    assert (ours.num_kv_heads, ours.head_dim, ours.rms_norm_eps, ours.max_position_embeddings) == (
        theirs.num_key_value_heads, theirs.head_dim, theirs.rms_norm_eps, theirs.max_position_embeddings)
    assert (ours.rope_theta, ours.rotated_dims) == (
        rope["rope_theta"], int(theirs.head_dim * rope["partial_rotary_factor"]))


def test_sarvam_moe_configs_that_cannot_run_are_refused_by_name():
    with pytest.raises(ConfigError, match="score_function 'softmax' is not supported for SarvamMoEForCausalLM"):
        from_hf_config({**SARVAM, **SARVAM_30B, "score_function": "softmax"})


LAGUNA = dict(SHAPE, architectures=["LagunaForCausalLM"], num_key_value_heads=1, head_dim=8, num_experts=8,
              num_experts_per_tok=2)


def test_laguna_fields_read_as_transformers_reads_them():
    """LagunaConfig's defaults: every layer full attention rotating half its head (theta 5e5), the sliding ones all
    of it (theta 1e4); the first MLP dense, the rest sparse (renormalised, a shared expert of 512); one softplus gate
    per head. Set fields: `mlp_layer_types`, `layer_types` with `sliding_window`, the routed scale."""
    cfg = from_hf_config(LAGUNA)
    assert (cfg.layer_windows, cfg.dense_layers, cfg.rotated_dims, cfg.rope_theta) == ((0,) * 4, (0,), 4, 5e5)
    assert (cfg.shared_expert_intermediate_size, cfg.norm_topk_prob, cfg.output_gate) == (512, True, "softplus")
    cfg = from_hf_config({**LAGUNA, "mlp_layer_types": ["sparse", "dense", "sparse", "dense"], "sliding_window": 4,
                          "layer_types": ["sliding_attention", "full_attention"] * 2, "moe_routed_scaling_factor": 2.0})
    assert (cfg.layer_windows, cfg.dense_layers, cfg.routed_scaling_factor) == ((4, 0, 4, 0), (1, 3), 2.0)
    assert [cfg.layer_rotated_dims(i) for i in range(2)] == [8, 4] and cfg.local_rope_theta == 1e4


@pytest.mark.parametrize("fields,message", [
    (dict(gating="per-element"), "gating 'per-element' is not supported for LagunaForCausalLM"),
    (dict(num_attention_heads_per_layer=[2, 4, 2, 2]), r"num_attention_heads_per_layer \[2, 4, 2, 2\] is not"),
    (dict(moe_router_logit_softcapping=30.0), "moe_router_logit_softcapping 30.0 is not supported"),
    (dict(mlp_layer_types=["dense", "moe", "sparse", "sparse"]), "must give each of the 4 layers"),
])
def test_laguna_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**LAGUNA, **fields})
