"""Config reading of OLMo 1, Ministral, Helium, CWM and the other families added as neighbours of one already run:
each as its transformers config class (through hf_models' `hf`: a class this transformers lacks skips) reads the same
fields, and the fields it cannot run refused by name (no model is run)."""

from __future__ import annotations

import pytest
from hf_models import hf

from jaxinfer import ConfigError, from_hf_config
from jaxinfer.models.olmo_hybrid import stored_names as olmo_hybrid_stored_names

BASE = dict(vocab_size=8, hidden_size=128, intermediate_size=8, num_hidden_layers=5, num_attention_heads=8)


def _check_common(cfg, ref, rope: dict | None = None) -> None:
    """Shapes, rope (`rope`: the full layers' parameters where they come per layer type), head tying and token ids
    as the transformers config holds them."""
    rope = rope or ref.rope_parameters
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == (
        rope["rope_theta"], rope["rope_type"], rope.get("factor", 1.0))
    assert (cfg.num_kv_heads, cfg.head_dim) == (ref.num_key_value_heads, getattr(ref, "head_dim", None) or 16)
    assert (cfg.max_position_embeddings, cfg.tie_word_embeddings) == (ref.max_position_embeddings,
                                                                      ref.tie_word_embeddings)
    eos = ref.eos_token_id if isinstance(ref.eos_token_id, list) else [] if ref.eos_token_id is None else [
        ref.eos_token_id]
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (ref.bos_token_id, tuple(eos))


def _windows(ref) -> tuple[int, ...]:
    return tuple(ref.sliding_window if t == "sliding_attention" else 0 for t in ref.layer_types)


@pytest.mark.parametrize("fields", [
    {},  # OlmoConfig's defaults: kv heads = heads, no clamp, no biases, eos 50279, 2048 positions
    dict(num_key_value_heads=2, clip_qkv=8.0, attention_bias=True, tie_word_embeddings=True,
         rope_parameters=dict(rope_type="linear", rope_theta=5e5, factor=2.0)),
])
def test_olmo_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["OlmoForCausalLM"]})
    ref = hf.OlmoConfig(**BASE, **fields)
    _check_common(cfg, ref)
    assert (cfg.clip_qkv, cfg.qkv_bias, cfg.o_bias) == (ref.clip_qkv, ref.attention_bias, ref.attention_bias)
    assert cfg.layer_norm and cfg.weightless_norms and cfg.rms_norm_eps == 1e-5  # OlmoLayerNorm's, fixed
    assert cfg.layer_windows == (0,) * 5


@pytest.mark.parametrize("fields", [
    {},  # MinistralConfig's defaults: Mistral's window of 4096 in every layer, 8 KV heads
    dict(sliding_window=None),  # no window: every layer full
    dict(head_dim=32, sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2 + ["full_attention"]),
])
def test_ministral_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["MinistralForCausalLM"]})
    ref = hf.MinistralConfig(**BASE, **fields)
    _check_common(cfg, ref)
    assert cfg.layer_windows == _windows(ref)
    assert (cfg.qkv_bias, cfg.o_bias, cfg.rms_norm_eps) == (False, False, ref.rms_norm_eps)


@pytest.mark.parametrize("fields", [
    {},  # CwmConfig's defaults: layers 0 and 4 full, the others over 8192 tokens; Llama 3's rope, theta 1e6
    dict(rope_theta=5e5),  # a top-level theta without rope parameters: the default rope still (transformers 5.24)
    dict(sliding_window=16, layer_types=["sliding_attention"] * 5, rope_scaling=dict(rope_type="linear", factor=2.0)),
])
def test_cwm_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["CwmForCausalLM"]})
    ref = hf.CwmConfig(**BASE, **fields)
    _check_common(cfg, ref)
    assert cfg.layer_windows == _windows(ref)
    assert (cfg.rms_norm_eps, cfg.qkv_bias, cfg.o_bias) == (ref.rms_norm_eps, False, False)
    assert cfg.rope_scaling.original_max_position_embeddings == ref.rope_parameters.get(
        "original_max_position_embeddings", cfg.rope_scaling.original_max_position_embeddings)


@pytest.mark.parametrize("fields", [
    dict(head_dim=16, num_key_value_heads=4),  # HeliumConfig's defaults otherwise: theta 1e5, eps 1e-8
    dict(head_dim=16, num_key_value_heads=2, attention_bias=True, rope_theta=1e4, tie_word_embeddings=True),
])
def test_helium_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["HeliumForCausalLM"]})
    ref = hf.HeliumConfig(**BASE, **fields)
    _check_common(cfg, ref)
    assert (cfg.rms_norm_eps, cfg.qkv_bias, cfg.o_bias) == (ref.rms_norm_eps, ref.attention_bias, False)
    assert cfg.rope_interleaved and cfg.norm_scale_first


@pytest.mark.parametrize("fields", [
    dict(pad_token_id=0),  # FlexOlmoConfig's defaults: 7 experts, 5 per token, not renormalised, theta 500000
    dict(pad_token_id=0, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, attention_bias=True,
         num_key_value_heads=2, rope_parameters=dict(rope_type="linear", rope_theta=1e4, factor=2.0)),
])
def test_flex_olmo_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["FlexOlmoForCausalLM"]})
    ref = hf.FlexOlmoConfig(**BASE, **fields)
    _check_common(cfg, ref)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (
        ref.num_experts, ref.num_experts_per_tok, ref.intermediate_size, ref.norm_topk_prob)
    assert (cfg.qkv_bias, cfg.o_bias, cfg.qk_norm_whole, cfg.rms_norm_eps) == (
        ref.attention_bias, ref.attention_bias, True, ref.rms_norm_eps)
    assert cfg.dense_layers == () and cfg.layer_windows == (0,) * 5


@pytest.mark.parametrize("fields", [
    {},  # MellumConfig's defaults: all full and sparse, 64 experts (8 per token, renormalised), thetas 5e5 / 1e4
    dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"] * 2 + ["sliding_attention"],
         mlp_layer_types=["dense"] + ["sparse"] * 4, num_local_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
         rope_parameters={"full_attention": dict(rope_type="linear", rope_theta=1e6, factor=2.0),
                          "sliding_attention": dict(rope_type="default", rope_theta=2e4)}),
])
def test_mellum_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["MellumForCausalLM"]})
    ref = hf.MellumConfig(**BASE, **fields)
    _check_common(cfg, ref, ref.rope_parameters["full_attention"])
    assert cfg.local_rope_theta == ref.rope_parameters["sliding_attention"]["rope_theta"]
    assert cfg.layer_windows == _windows(ref) and cfg.rotated_dims == cfg.head_dim
    assert cfg.dense_layers == tuple(i for i, kind in enumerate(ref.mlp_layer_types) if kind == "dense")
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (
        ref.num_experts, ref.num_experts_per_tok, ref.moe_intermediate_size, ref.norm_topk_prob)
    assert (cfg.qk_norm, cfg.qk_norm_whole, cfg.rms_norm_eps) == (True, False, ref.rms_norm_eps)


@pytest.mark.parametrize("fields", [
    {},  # Jais2Config's defaults: relu2, LayerNorms with biases (eps 1e-5), q/k/v/o and MLP biases, 8192 positions
    dict(attention_bias=False, mlp_bias=False, layer_norm_eps=1e-6, num_key_value_heads=2, tie_word_embeddings=True,
         rope_parameters=dict(rope_type="linear", rope_theta=5e5, factor=2.0)),
])
def test_jais2_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["Jais2ForCausalLM"]})
    ref = hf.Jais2Config(**BASE, **fields)
    _check_common(cfg, ref)
    assert (cfg.layer_norm, cfg.norm_bias, cfg.rms_norm_eps, cfg.activation) == (True, True, ref.layer_norm_eps,
                                                                                ref.hidden_act)
    assert (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) == (ref.attention_bias, ref.attention_bias, ref.mlp_bias)


@pytest.mark.parametrize("fields", [
    {},  # HyperCLOVAXConfig's defaults: multipliers 1, scale head_dim ** -0.5, output norms on
    dict(head_dim=32, attention_multiplier=0.1, logits_scaling=0.25, embedding_multiplier=2.0, residual_multiplier=0.5,
         use_post_norm=False, attention_bias=True),
])
def test_hyperclovax_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["HyperCLOVAXForCausalLM"]})
    ref = hf.HyperCLOVAXConfig(**BASE, **fields)
    _check_common(cfg, ref)
    assert (cfg.attn_scale, cfg.embedding_multiplier, cfg.residual_multiplier) == (
        ref.attention_multiplier, ref.embedding_multiplier, ref.residual_multiplier)
    assert cfg.logits_scaling == 1 / ref.logits_scaling  # ours divides, HyperCLOVA X multiplies
    assert (cfg.output_norms, cfg.qkv_bias, cfg.o_bias, cfg.rms_norm_eps) == (
        ref.use_post_norm, ref.attention_bias, ref.attention_bias, ref.rms_norm_eps)


@pytest.mark.parametrize("fields", [
    {},  # YoutuConfig's defaults: DeepSeek-V3's MLA dims, a 1536-rank query, rope in pairs, tied head
    dict(kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24,
         rope_interleave=False, tie_word_embeddings=False,
         rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0, mscale_all_dim=1.0,
                              original_max_position_embeddings=128)),
])
def test_youtu_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["YoutuForCausalLM"]})
    ref = hf.YoutuConfig(**BASE, **fields)
    mla = cfg.latent_attention
    assert (mla.kv_lora_rank, mla.q_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim, mla.v_head_dim) == (
        ref.kv_lora_rank, ref.q_lora_rank or 0, ref.qk_rope_head_dim, ref.qk_nope_head_dim, ref.v_head_dim)
    assert (cfg.rope_interleaved, cfg.tie_word_embeddings, cfg.num_experts) == (ref.rope_interleave,
                                                                               ref.tie_word_embeddings, 0)
    assert (cfg.num_kv_heads, cfg.head_dim) == (1, ref.kv_lora_rank + ref.qk_rope_head_dim)  # one cached row
    assert (cfg.bos_token_id, cfg.eos_token_ids, cfg.max_position_embeddings, cfg.rms_norm_eps) == (
        ref.bos_token_id, (ref.eos_token_id,), ref.max_position_embeddings, ref.rms_norm_eps)


KOLIBRI1 = {key: value for key, value in BASE.items() if key != "intermediate_size"}  # it has no dense MLP


@pytest.mark.parametrize("fields", [
    {},  # Kolibri1Config's defaults: every fifth layer full (NoPE), the others over 513 tokens; 384 experts, 6 each
    dict(sliding_window=None, layer_types=["full_attention"] * 5, num_experts=8, num_experts_per_tok=2,
         norm_topk_prob=True, moe_intermediate_size=32, shared_expert_intermediate_size=48, head_dim=16),
])
def test_kolibri1_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**KOLIBRI1, **fields, "architectures": ["Kolibri1ForCausalLM"]})
    ref = hf.Kolibri1Config(**KOLIBRI1, **fields)
    _check_common(cfg, ref)
    assert cfg.layer_windows == tuple(ref.sliding_window if t == "sliding_attention" else 0 for t in ref.layer_types)
    rotates = [ref.sliding_window is None or t == "sliding_attention" for t in ref.layer_types]  # Kolibri1Attention's
    assert cfg.nope_layers == tuple(i for i, r in enumerate(rotates) if not r)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (
        ref.num_experts, ref.num_experts_per_tok, ref.moe_intermediate_size, ref.norm_topk_prob)
    assert (cfg.shared_expert_intermediate_size, cfg.dense_layers, cfg.qk_norm, cfg.qkv_bias) == (
        ref.shared_expert_intermediate_size, (), True, False)


@pytest.mark.parametrize("fields", [
    {},  # HYV3Config's defaults: layer 0 dense; 192 experts, 8 each, scaled by 2.826; one shared MLP; theta 11158840
    dict(mlp_layer_types=["sparse", "dense", "sparse", "sparse", "dense"], num_experts=8, num_experts_per_tok=2,
         num_shared_experts=2, moe_intermediate_size=32, router_scaling_factor=1.5, attention_bias=True, head_dim=32,
         num_key_value_heads=2, rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0)),
])
def test_hy_v3_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["HYV3ForCausalLM"]})
    ref = hf.HYV3Config(**BASE, **fields)
    _check_common(cfg, ref)
    assert cfg.dense_layers == tuple(i for i, kind in enumerate(ref.mlp_layer_types) if kind == "dense")
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size, cfg.routed_scaling_factor) == (
        ref.num_experts, ref.num_experts_per_tok, ref.moe_intermediate_size, ref.router_scaling_factor)
    assert cfg.shared_expert_intermediate_size == ref.num_shared_experts * ref.moe_intermediate_size
    assert (cfg.expert_groups, cfg.norm_topk_prob, cfg.qk_norm, cfg.qk_norm_after_rope) == (1, True, True, False)
    assert (cfg.qkv_bias, cfg.o_bias, cfg.rms_norm_eps) == (ref.attention_bias, ref.attention_bias, ref.rms_norm_eps)


@pytest.mark.parametrize("arch, config, fields, theta, local_theta", [
    # full every fourth layer, 128-token windows, Granite's one base everywhere; sinks
    ("GraniteSWAForCausalLM", "GraniteSWAConfig", {}, 1e4, None),
    ("GraniteSWAForCausalLM", "GraniteSWAConfig", dict(layer_rope_theta=[0, 1e4, 1e4, 1e4, 0], sliding_window=16,
                                                         attention_multiplier=0.3, logits_scaling=2.0), 1e4, None),
    ("GraniteMoeSWAForCausalLM", "GraniteMoeSWAConfig", dict(num_local_experts=4, shared_intermediate_size=48,
                                                             layer_rope_theta=[1e6, 1e4, 1e4, 1e4, 1e6]), 1e6, 1e4),
])
def test_granite_swa_fields_read_as_transformers_reads_them(arch, config, fields, theta, local_theta):
    cfg, ref = from_hf_config({**BASE, **fields, "architectures": [arch]}), getattr(hf, config)(**BASE, **fields)
    _check_common(cfg, ref, dict(ref.rope_parameters, rope_theta=theta))
    assert cfg.layer_windows == _windows(ref) and cfg.attn_sinks and cfg.rms_norm_eps == ref.rms_norm_eps
    assert cfg.nope_layers == tuple(i for i, base in enumerate(ref.layer_rope_theta) if not base)
    assert cfg.local_rope_theta == local_theta
    assert (cfg.attn_scale, cfg.logits_scaling) == (ref.attention_multiplier, ref.logits_scaling)
    experts = (getattr(ref, "num_local_experts", 0), getattr(ref, "shared_intermediate_size", 0))
    assert (cfg.num_experts, cfg.shared_expert_intermediate_size) == experts


@pytest.mark.parametrize("fields", [
    {},  # AfmoeConfig's defaults: full every fourth layer (NoPE), 1024-token windows, layer 0 dense, 64 experts, 6 each
    dict(layer_types=["full_attention", "sliding_attention"] * 2 + ["full_attention"], sliding_window=16,
         num_dense_layers=2, num_experts=8, num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=32,
         route_scale=2.0, mup_enabled=True, attention_bias=True, num_key_value_heads=2, head_dim=32),
])
def test_afmoe_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["AfmoeForCausalLM"]})
    ref = hf.AfmoeConfig(**BASE, **fields)
    _check_common(cfg, ref)
    assert cfg.layer_windows == _windows(ref)
    assert cfg.nope_layers == tuple(i for i, kind in enumerate(ref.layer_types) if kind == "full_attention")
    assert cfg.dense_layers == tuple(range(ref.num_dense_layers))
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size, cfg.routed_scaling_factor) == (
        ref.num_experts, ref.num_experts_per_tok, ref.moe_intermediate_size, ref.route_scale)
    assert cfg.shared_expert_intermediate_size == ref.num_shared_experts * ref.moe_intermediate_size
    assert cfg.embedding_multiplier == (ref.hidden_size**0.5 if ref.mup_enabled else 1.0)
    assert (cfg.qk_norm, cfg.norm_topk_prob, cfg.qkv_bias, cfg.o_bias) == (True, True, ref.attention_bias,
                                                                           ref.attention_bias)


@pytest.mark.parametrize("fields", [
    dict(num_hidden_layers=36),  # DoryConfig's defaults: 8 layers in, 20 twice over, 8 out; every fourth full
    dict(num_hidden_layers=6, layer_types=["full_attention", "sliding_attention", "sliding_attention"] * 2,
         n_input_layers=1, n_recurrent_layers=3, n_output_layers=2, n_recurrent_loops=3, sliding_window=16,
         initializer_range=0.02, ngpt_alpha_init=0.1, attention_bias=True, num_key_value_heads=2, head_dim=32,
         rope_parameters={"full_attention": dict(rope_type="linear", factor=2.0, rope_theta=5e6),
                          "sliding_attention": dict(rope_type="default", rope_theta=2e4)}),
])
def test_dory_fields_read_as_transformers_reads_them(fields):
    """As config.json holds them (to_dict: the released layout, two blocks a layer) and as given, the loops unrolled."""
    ref = hf.DoryConfig(**{**BASE, **fields})
    for hf_config in (ref.to_dict(), {**BASE, **fields}):
        cfg = from_hf_config({**hf_config, "architectures": ["DoryForCausalLM"]})
        _check_common(cfg, ref, ref.rope_parameters["full_attention"])
        assert cfg.local_rope_theta == ref.rope_parameters["sliding_attention"]["rope_theta"]
        looped, recurrent = cfg.looped, ref.n_recurrent_layers
        assert (looped.stored_layers, looped.input_layers, looped.recurrent_layers, looped.loops) == (
            ref.num_hidden_layers, ref.n_input_layers, recurrent, ref.n_recurrent_loops)
        assert (looped.init_scale, looped.alpha_init) == (ref.initializer_range, ref.ngpt_alpha_init)
        assert cfg.num_layers == ref.num_hidden_layers + (ref.n_recurrent_loops - 1) * recurrent
        passes = range(ref.n_input_layers, ref.n_input_layers + recurrent)
        runs = [*range(ref.n_input_layers), *list(passes) * ref.n_recurrent_loops,
                *range(ref.n_input_layers + recurrent, ref.num_hidden_layers)]
        assert [looped.stored(i) for i in range(cfg.num_layers)] == runs
        assert cfg.layer_windows == tuple(_windows(ref)[i] for i in runs)
        assert (cfg.qkv_bias, cfg.o_bias, cfg.logits_scaling) == (ref.attention_bias, ref.attention_bias,
                                                                 ref.initializer_range)


def test_dory_stored_names_read_as_transformers_renames_them():
    """The released checkpoints' names (two blocks a layer, under `backbone.`) and what transformers saves, each as
    transformers' conversion mapping for "dory" renames it."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    from jaxinfer.models.dory import stored_names

    renames = get_checkpoint_conversion_mapping("dory")
    if not renames:
        pytest.skip("this transformers has no conversion mapping for Dory")
    names = ["backbone.embeddings.weight", "backbone.layers.4.mixer.g_proj.weight", "backbone.layers.4.attn_alpha",
             "backbone.layers.4.mixer.sqk", "backbone.layers.5.mixer.up_proj.weight", "backbone.layers.5.mlp_alpha",
             "backbone.layers.5.mixer.suv_gate", "backbone.layers.2.self_attn.g_proj.weight",
             "backbone.layers.2.mlp.down_proj.weight", "backbone.layers.2.lambda_1", "lm_head.logit_scale"]
    expected = {}
    for name in names:
        renamed = name
        for rename in renames:
            renamed, _ = rename.rename_source_key(renamed)
        expected[renamed] = name
    assert stored_names(names) == expected
    assert stored_names(["model.layers.0.lambda_1"]) == {}  # transformers' own names: read as named


@pytest.mark.parametrize("fields", [
    {},  # HrmTextConfig's defaults: 2 H cycles of 3 L runs, embeddings x 1 / 0.02
    dict(H_cycles=3, L_cycles=1, embedding_scale=4.0, num_key_value_heads=2, head_dim=32, hidden_act="gelu",
         rope_parameters=dict(rope_type="linear", rope_theta=5e5, factor=2.0), tie_word_embeddings=True),
])
def test_hrm_text_fields_read_as_transformers_reads_them(fields):
    """As config.json holds them (num_hidden_layers inflated beside num_layers_per_stack) and as given."""
    ref = hf.HrmTextConfig(**BASE, **fields)
    for hf_config in (ref.to_dict(), {**BASE, **fields}):
        cfg = from_hf_config({**hf_config, "architectures": ["HrmTextForCausalLM"]})
        assert (cfg.rope_theta, cfg.rope_scaling.rope_type) == (ref.rope_parameters["rope_theta"],
                                                                ref.rope_parameters["rope_type"])
        cycles = cfg.hrm_cycles
        assert (cycles.stack_layers, cycles.high_cycles, cycles.low_cycles) == (ref.num_layers_per_stack,
                                                                                 ref.H_cycles, ref.L_cycles)
        assert cfg.num_layers == ref.num_hidden_layers  # transformers' cache slots: one per stack layer run
        assert (cfg.num_kv_heads, cfg.head_dim, cfg.embedding_multiplier) == (ref.num_attention_heads, ref.head_dim,
                                                                              ref.embedding_scale)
        assert (cfg.tie_word_embeddings, cfg.weightless_norms, cfg.final_norm) == (ref.tie_word_embeddings, True,
                                                                                   False)


@pytest.mark.parametrize("fields", [
    {},  # BeamConfig's defaults: every sixth layer and the last full (NoPE), 512-token windows, 3 dense layers
    dict(layer_types=["full_attention", "sliding_attention"] * 2 + ["sliding_attention"], sliding_window=16,
         mlp_layer_types=["dense", "sparse", "dense", "sparse", "sparse"], num_experts=8, num_experts_per_tok=2,
         n_group=2, topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=False, final_logit_softcapping=None,
         attention_bias=True, num_key_value_heads=2, head_dim=32,
         rope_parameters={"full_attention": dict(rope_type="linear", factor=2.0, rope_theta=5e5),
                          "sliding_attention": dict(rope_type="default", rope_theta=2e4)}),
])
def test_beam_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["BeamForCausalLM"]})
    ref = hf.BeamConfig(**BASE, **fields)
    full, sliding = ref.rope_parameters["full_attention"], ref.rope_parameters["sliding_attention"]
    _check_common(cfg, ref, full or sliding)
    assert cfg.local_rope_theta == sliding["rope_theta"]
    assert cfg.layer_windows == _windows(ref)
    assert cfg.nope_layers == tuple(i for i, kind in enumerate(ref.layer_types) if ref.rope_parameters[kind] is None)
    assert cfg.dense_layers == tuple(i for i, kind in enumerate(ref.mlp_layer_types) if kind == "dense")
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size, cfg.routed_scaling_factor) == (
        ref.num_experts, ref.num_experts_per_tok, ref.moe_intermediate_size, ref.routed_scaling_factor)
    assert (cfg.expert_groups, cfg.expert_groups_per_token, cfg.norm_topk_prob) == (ref.n_group, ref.topk_group,
                                                                                     ref.norm_topk_prob)
    assert (cfg.final_soft_cap, cfg.shared_expert_intermediate_size) == (ref.final_logit_softcapping, 0)
    assert (cfg.qk_norm, cfg.qkv_bias, cfg.o_bias) == (True, ref.attention_bias, ref.attention_bias)


@pytest.mark.parametrize("fields", [
    {},  # ZayaConfig's defaults: every layer full ("hybrid"), half of each head rotated (base 5e6), 16 experts
    dict(layer_types=["hybrid_sliding", "hybrid"] * 2 + ["hybrid_sliding"], sliding_window=32, num_experts=8,
         moe_intermediate_size=16, router_hidden_size=8, cca_time0=3, cca_time1=2, head_dim=32, lm_head_bias=True,
         tie_word_embeddings=False,
         rope_parameters={"hybrid": dict(rope_type="linear", factor=2.0, rope_theta=1e6, partial_rotary_factor=0.25),
                          "hybrid_sliding": dict(rope_type="default", rope_theta=2e4, partial_rotary_factor=0.5)}),
])
def test_zaya_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["ZayaForCausalLM"]})
    ref = hf.ZayaConfig(**BASE, **fields)
    full, sliding = ref.rope_parameters["hybrid"], ref.rope_parameters["hybrid_sliding"]
    _check_common(cfg, ref, full)
    assert (cfg.local_rope_theta, cfg.rotary_dim, cfg.local_rotary_dim) == (
        sliding["rope_theta"], int(ref.head_dim * full["partial_rotary_factor"]),
        int(ref.head_dim * sliding["partial_rotary_factor"]))
    assert cfg.layer_windows == tuple(ref.sliding_window if t == "hybrid_sliding" else 0 for t in ref.layer_types)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size) == (ref.num_experts, 1,
                                                                                   ref.moe_intermediate_size)
    assert (cfg.zaya.router_hidden_size, cfg.zaya.cca_taps) == (ref.router_hidden_size, (ref.cca_time0, ref.cca_time1))
    heads, kv, k = ref.num_attention_heads, ref.num_key_value_heads, ref.head_dim
    state = cfg.state_space  # every layer: the conv state of q/k projections and delayed values, beside its pages
    assert (state.layers, state.conv_channels, state.conv_kernel, state.parallel_attention) == (
        tuple(range(ref.num_hidden_layers)), (heads + kv) * k + kv * k // 2, ref.cca_time0 + ref.cca_time1 - 1, True)
    assert (cfg.lm_head_bias, cfg.rms_norm_eps) == (ref.lm_head_bias, ref.rms_norm_eps)


@pytest.mark.parametrize("fields", [
    {},  # DogeConfig's defaults: multi-head (K/V heads = heads), 2048 positions = keep_window_size, dense
    dict(num_key_value_heads=2, attention_bias=True, sliding_window=64, max_position_embeddings=1024,
         keep_window_size=1024, hidden_act="gelu",
         rope_parameters=dict(rope_type="linear", rope_theta=5e4, factor=2.0)),
])
def test_doge_fields_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BASE, **fields, "architectures": ["DogeForCausalLM"]})
    ref = hf.DogeConfig(**BASE, **fields)
    K = ref.hidden_size // ref.num_attention_heads
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type) == (ref.rope_parameters["rope_theta"],
                                                            ref.rope_parameters["rope_type"])
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim, cfg.attn_scale) == (ref.num_key_value_heads, 2 * K, K,
                                                                                K ** -0.5)
    assert cfg.layer_windows == (ref.sliding_window or 0,) * ref.num_hidden_layers
    assert (cfg.qk_norm, cfg.qkv_bias, cfg.o_bias, cfg.activation) == (True, ref.attention_bias, ref.attention_bias,
                                                                       "gelu" if ref.hidden_act == "gelu" else "silu")


@pytest.mark.parametrize("arch, fields, message", [
    ("OlmoForCausalLM", dict(clip_qkv=0.0), "clip_qkv 0.0 must be positive or null"),
    ("OlmoForCausalLM", dict(layer_types=["sliding_attention"] * 5, sliding_window=4),
     "not supported for OlmoForCausalLM"),
    ("OlmoForCausalLM", dict(mlp_bias=True), "mlp_bias=True is not supported for OlmoForCausalLM"),
    ("MinistralForCausalLM", dict(sliding_window=None, layer_types=["sliding_attention"] * 5),
     "sliding_window None is not supported for MinistralForCausalLM's sliding layers"),
    ("MinistralForCausalLM", dict(layer_types=["chunked_attention"] * 5), "layer_types .* must list one of"),
    ("CwmForCausalLM", dict(sliding_window=0), "sliding_window 0 is not supported for CwmForCausalLM"),
    ("HeliumForCausalLM", dict(head_dim=32), "head_dim 32 is not supported for HeliumForCausalLM with 8 heads.*128"),
    ("HeliumForCausalLM", dict(head_dim=16, mlp_bias=True), "mlp_bias=True is not supported for HeliumForCausalLM"),
    ("FlexOlmoForCausalLM", dict(num_experts=4, num_experts_per_tok=5), "num_experts_per_tok 5 must be between 1"),
    ("FlexOlmoForCausalLM", dict(layer_types=["sliding_attention"] * 5, sliding_window=4),
     "not supported for FlexOlmoForCausalLM"),
    ("FlexOlmoForCausalLM", dict(head_dim=32), "head_dim 32 is not supported for FlexOlmoForCausalLM: its q/k norms"),
    ("MellumForCausalLM", dict(rope_parameters={"full_attention": dict(rope_theta=1e4, partial_rotary_factor=0.5)}),
     "rope_parameters.full_attention.partial_rotary_factor 0.5 is not supported for MellumForCausalLM"),
    ("MellumForCausalLM", dict(rope_parameters=dict(rope_type="default", rope_theta=1e4)),
     "one set per layer type"),
    ("MellumForCausalLM", dict(mlp_layer_types=["dense"] * 4), "mlp_layer_types .* must give each of the 5 layers"),
    ("MellumForCausalLM", dict(layer_types=["sliding_attention"] * 5, sliding_window=None),
     "sliding_window None is not supported for MellumForCausalLM's sliding layers"),
    ("Jais2ForCausalLM", dict(hidden_act="relu"), "activation 'relu' is not supported"),
    ("Jais2ForCausalLM", dict(layer_types=["sliding_attention"] * 5, sliding_window=4),
     "not supported for Jais2ForCausalLM"),
    ("HyperCLOVAXForCausalLM", dict(logits_scaling=0.0),
     "logits_scaling 0.0 is not supported for HyperCLOVAXForCausalLM"),
    ("HyperCLOVAXForCausalLM", dict(mlp_bias=True), "mlp_bias=True is not supported for HyperCLOVAXForCausalLM"),
    ("YoutuForCausalLM", dict(attention_bias=True), "attention_bias=True is not supported for YoutuForCausalLM"),
    ("YoutuForCausalLM", dict(mlp_bias=True), "mlp_bias=True is not supported for YoutuForCausalLM"),
    ("Kolibri1ForCausalLM", dict(shared_expert_intermediate_size=0),
     "shared_expert_intermediate_size 0 is not supported for Kolibri1ForCausalLM"),
    ("Kolibri1ForCausalLM", dict(layer_types=["sliding_attention"] * 5, sliding_window=None),
     "sliding layers but sliding_window is null for Kolibri1ForCausalLM"),
    ("Kolibri1ForCausalLM", dict(num_experts=4, num_experts_per_tok=6), "num_experts_per_tok 6 must be between 1"),
    ("MellumForCausalLM", dict(rope_parameters={"sliding_attention": dict(rope_type="linear", factor=2.0)}),
     "sliding layers' rope .* is not supported"),
    ("HYV3ForCausalLM", dict(mlp_layer_types=["dense", "moe", "sparse", "sparse", "sparse"]),
     "mlp_layer_types .* must give one of \\['dense', 'sparse'\\] for each of the 5 layers"),
    ("HYV3ForCausalLM", dict(num_shared_experts=0), "num_shared_experts 0 is not supported for HYV3ForCausalLM"),
    ("HYV3ForCausalLM", dict(num_experts=4, num_experts_per_tok=6), "num_experts_per_tok 6 must be in \\[1, "),
    ("HYV3ForCausalLM", dict(mlp_bias=True), "mlp_bias=True is not supported for HYV3ForCausalLM"),
    ("GraniteSWAForCausalLM", dict(layer_rope_theta=[1e4, 1e4, 2e4, 1e4, 1e4]),
     "one base for the full layers and one for the sliding ones"),
    ("GraniteSWAForCausalLM", dict(layer_rope_theta=[1e6, 1e4, 1e4, 1e4, 1e6],
                                   rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=1e4)),
     "with rope type 'linear': the sliding layers' own base runs unscaled"),
    ("GraniteSWAForCausalLM", dict(layer_rope_theta=[1e4] * 4), "must give a base >= 0 .* for each of the 5 layers"),
    ("GraniteMoeSWAForCausalLM", dict(sliding_window=None),
     "sliding_window None is not supported for GraniteMoeSWAForCausalLM's sliding layers"),
    ("GraniteMoeSWAForCausalLM", dict(layer_types=["chunked_attention"] * 5), "layer_types .* must give one of"),
    ("AfmoeForCausalLM", dict(num_shared_experts=0), "num_shared_experts 0 is not supported for AfmoeForCausalLM"),
    ("AfmoeForCausalLM", dict(num_experts=4, num_experts_per_tok=5), "num_experts_per_tok 5 must be in \\[1, "),
    ("AfmoeForCausalLM", dict(sliding_window=0), "sliding_window 0 must be >= 1 for AfmoeForCausalLM"),
    ("AfmoeForCausalLM", dict(layer_types=["chunked_attention"] * 5), "layer_types .* must give one of"),
    ("DoryForCausalLM", dict(n_input_layers=1, n_output_layers=1, recurrent_kv_cache_mode="last_loop"),
     "recurrent_kv_cache_mode 'last_loop' is not supported for DoryForCausalLM: 'per_loop' only"),
    ("DoryForCausalLM", dict(n_input_layers=1, n_recurrent_layers=1, n_output_layers=1),
     "n_input_layers 1 \\+ n_recurrent_layers 1 \\+ n_output_layers 1 must equal num_hidden_layers 5"),
    ("DoryForCausalLM", {}, "n_input_layers 8, n_recurrent_layers -11 and n_recurrent_loops 2 must split the 5"),
    ("DoryForCausalLM", dict(n_input_layers=1, n_output_layers=1, n_recurrent_loops=0), "with >= 1 loop"),
    ("DoryForCausalLM", dict(n_input_layers=1, n_output_layers=1, sliding_window=0),
     "sliding_window 0 must be >= 1 for DoryForCausalLM"),
    ("DoryForCausalLM", dict(n_input_layers=1, n_output_layers=1, layer_types=["chunked_attention"] * 5),
     "layer_types .* must give one of"),
    ("DoryForCausalLM", dict(n_input_layers=1, n_output_layers=1, mlp_bias=True),
     "mlp_bias=True is not supported for DoryForCausalLM"),
    ("HrmTextForCausalLM", dict(attention_bias=True), "attention_bias=True is not supported for HrmTextForCausalLM"),
    ("HrmTextForCausalLM", dict(num_layers_per_stack=2), "num_hidden_layers 5 must be num_layers_per_stack x H_cycles"),
    ("HrmTextForCausalLM", dict(H_cycles=0), "H_cycles 0 and L_cycles 3 must each be >= 1"),
    ("HrmTextForCausalLM", dict(mlp_bias=True), "mlp_bias=True is not supported for HrmTextForCausalLM"),
    ("BeamForCausalLM", dict(layer_types=["chunked_attention"] * 5), "layer_types .* must give one of"),
    ("BeamForCausalLM", dict(mlp_layer_types=["dense", "moe"] + ["sparse"] * 3), "mlp_layer_types .* must give one"),
    ("BeamForCausalLM", dict(sliding_window=0), "sliding_window 0 must be >= 1 for BeamForCausalLM"),
    ("BeamForCausalLM", dict(n_group=3), "n_group 3 must divide the 256 routed experts"),
    ("BeamForCausalLM", dict(rope_parameters={"sliding_attention": dict(rope_type="linear", factor=2.0)}),
     "rope_parameters.sliding_attention .* is not supported for BeamForCausalLM"),
    ("BeamForCausalLM", dict(rope_parameters=dict(rope_type="default", rope_theta=1e4)), "one set \\(or null\\) per"),
    ("BeamForCausalLM", dict(mlp_bias=True), "mlp_bias=True is not supported for BeamForCausalLM"),
    ("DogeForCausalLM", dict(is_moe=True), "is_moe=True is not supported for DogeForCausalLM"),
    ("DogeForCausalLM", dict(max_position_embeddings=4096), "max_position_embeddings 4096 above keep_window_size 2048"),
    ("DogeForCausalLM", dict(mlp_bias=True), "mlp_bias=True is not supported for DogeForCausalLM"),
    ("ZayaForCausalLM", dict(attention_bias=True), "attention_bias=True is not supported for ZayaForCausalLM"),
    ("ZayaForCausalLM", dict(num_experts_per_tok=2), "num_experts_per_tok 2 is not supported for ZayaForCausalLM"),
    ("ZayaForCausalLM", dict(cca_time0=1, cca_time1=1), "cca_time0 1 and cca_time1 1 are not supported"),
    ("ZayaForCausalLM", dict(layer_types=["sliding_attention"] * 5), "layer_types .* must give one of"),
    ("ZayaForCausalLM", dict(layer_types=["hybrid_sliding"] * 5), "sliding_window None is not supported"),
    ("ZayaForCausalLM", dict(rope_parameters={"hybrid_sliding": dict(rope_type="linear", factor=2.0)}),
     "rope_parameters.hybrid_sliding .* is not supported for ZayaForCausalLM"),
    ("OlmoHybridForCausalLM", dict(hidden_act="gelu"),
     "hidden_act 'gelu' is not supported for OlmoHybridForCausalLM \\(its DeltaNet conv runs it\\)"),
    ("OlmoHybridForCausalLM", dict(layer_types=["sliding_attention"] * 5), "layer_types .* must give one of"),
    ("BailingHybridForCausalLM", dict(hidden_act="gelu"),
     "hidden_act 'gelu' is not supported for BailingHybridForCausalLM \\(its KDA conv and MLPs run SiLU\\)"),
    ("BailingHybridForCausalLM", dict(kda_lower_bound=0.0), "kda_lower_bound 0.0 is not supported for "
     "BailingHybridForCausalLM under kda_safe_gate"),
    ("BailingHybridForCausalLM", dict(layer_group_size=0), "layer_group_size 0 must be >= 1"),
])
def test_configs_that_cannot_run_are_refused_by_name(arch, fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**BASE, **fields, "architectures": [arch]})


@pytest.mark.parametrize("arch, lacks", [
    ("InklingForConditionalGeneration", "keep Thinking Machines' own layout"),
    ("Inkling2ForCausalLM", "block attention residual"),
    ("Inkling2LoopForConditionalGeneration", "looped variant"),
    ("Dots3NoteForCausalLM", "latent shapes that differ per layer type"),
    ("Dots3NoteForConditionalGeneration", "latent shapes that differ per layer type"),
])
def test_hybrids_that_do_not_map_onto_the_mixers_are_refused_with_what_they_lack(arch, lacks):
    with pytest.raises(ConfigError, match=f"'{arch}' is not supported \\(.*{lacks}.*not supported yet"):
        from_hf_config({**BASE, "architectures": [arch]})


def test_olmo_hybrid_reads_its_norms_under_transformers_module_names_too():
    stored = ["model.layers.0.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
              "model.layers.1.post_feedforward_layernorm.weight", "model.norm.weight"]
    assert olmo_hybrid_stored_names(stored) == {
        "model.layers.0.attention_layer_norm.weight": "model.layers.0.input_layernorm.weight",
        "model.layers.1.feedforward_layer_norm.weight": "model.layers.1.post_attention_layernorm.weight",
    }
    assert olmo_hybrid_stored_names(["model.layers.0.attention_layer_norm.weight"]) == {}
