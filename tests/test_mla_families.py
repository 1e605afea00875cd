"""DeepSeek's latent attention under other names beyond the parity tests every family runs (test_hf_parity):
GLM-4.7-Flash's, Mistral 4's, MiniCPM3's, Mistral Large 4's and LongCat-Flash's configs read as transformers reads
them, what cannot run refused by name, Mistral 4's router against transformers' own, Mistral Small 4's
Mistral3ForConditionalGeneration config. No model is run here."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hf_models import hf
from transformers.models.glm4_moe_lite import modeling_glm4_moe_lite
from transformers.models.mistral4 import modeling_mistral4

from jaxinfer import ConfigError, from_hf_config
from jaxinfer.models.grouped_topk import grouped_topk
from jaxinfer.speculative.mtp import check_mtp_target

SHAPE = dict(vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=3, num_attention_heads=2)
GLM_LITE, MISTRAL4 = "Glm4MoeLiteForCausalLM", "Mistral4ForCausalLM"
# GLM-4.7-Flash's config.json as released (transformers 4's layout): rope_theta, partial_rotary_factor and
# first_k_dense_replace at the top, topk_method named, its MTP layer stored after the decoder's
GLM_LITE_RELEASED = dict(rope_theta=1e6, rope_scaling=None, partial_rotary_factor=1.0, first_k_dense_replace=1,
                         topk_method="noaux_tc", num_nextn_predict_layers=1, n_group=1, topk_group=1,
                         num_key_value_heads=2, eos_token_id=[5, 6, 7], pad_token_id=5)
GLM_LITE_LAYOUTS = [
    {}, GLM_LITE_RELEASED,
    dict(mlp_layer_types=["dense", "dense", "sparse"], q_lora_rank=None, rope_interleave=False, n_routed_experts=8,
         n_group=4, topk_group=2, num_experts_per_tok=3, norm_topk_prob=False, n_shared_experts=2),
    dict(rope_parameters=dict(rope_type="yarn", factor=8.0, mscale=1.0, mscale_all_dim=0.7, rope_theta=1e4,
                              original_max_position_embeddings=4096), max_position_embeddings=32768),
]


def _latent(ours, theirs) -> None:
    """The latent attention's dims, the cache row and the rotated dims as transformers' config gives them."""
    mla = ours.latent_attention
    assert (mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.q_lora_rank or None) == (
        theirs.kv_lora_rank, theirs.qk_nope_head_dim, theirs.qk_rope_head_dim, theirs.v_head_dim, theirs.q_lora_rank)
    assert (ours.num_kv_heads, ours.head_dim, ours.rope_interleaved) == (
        1, theirs.kv_lora_rank + theirs.qk_rope_head_dim, theirs.rope_interleave)
    assert (ours.num_experts, ours.experts_per_token, ours.moe_intermediate_size) == (
        theirs.n_routed_experts, theirs.num_experts_per_tok, theirs.moe_intermediate_size)
    assert (ours.shared_expert_intermediate_size, ours.expert_groups, ours.expert_groups_per_token) == (
        theirs.n_shared_experts * theirs.moe_intermediate_size, theirs.n_group, theirs.topk_group)
    assert (ours.norm_topk_prob, ours.routed_scaling_factor) == (theirs.norm_topk_prob, theirs.routed_scaling_factor)
    assert (ours.rms_norm_eps, ours.max_position_embeddings, ours.tie_word_embeddings, ours.activation) == (
        theirs.rms_norm_eps, theirs.max_position_embeddings, theirs.tie_word_embeddings, theirs.hidden_act)
    eos = theirs.eos_token_id
    assert (ours.bos_token_id, ours.eos_token_ids) == (theirs.bos_token_id, tuple(eos if isinstance(eos, list) else
                                                                                 [eos]))


@pytest.mark.parametrize("fields", GLM_LITE_LAYOUTS)
def test_glm4_moe_lite_fields_read_as_transformers_reads_them(fields):
    ours = from_hf_config({**SHAPE, **fields, "architectures": [GLM_LITE]})
    theirs = transformers.Glm4MoeLiteConfig(**SHAPE, **fields)
    _latent(ours, theirs)
    rope = theirs.rope_parameters
    assert ours.rotated_dims == int(theirs.qk_rope_head_dim * rope.get("partial_rotary_factor", 1.0))
    assert (ours.rope_theta, ours.rope_scaling.rope_type) == (rope["rope_theta"], rope["rope_type"])
    scale = modeling_glm4_moe_lite.yarn_apply_mscale(rope, theirs.qk_head_dim**-0.5)
    assert ours.attn_scale == pytest.approx(scale, rel=1e-12)
    assert ours.dense_layers == tuple(i for i, kind in enumerate(theirs.mlp_layer_types) if kind == "dense")
    assert ours.mtp_layers == fields.get("num_nextn_predict_layers", 0)


def test_glm4_moe_lite_mtp_layer_drafts_as_deepseek_v3s():
    """method "mtp" takes GLM-4.7-Flash's MTP layer (DeepSeek-V3's layer after the decoder's; test_engine_mtp runs
    V3's and GLM-4.5's) and refuses a checkpoint declaring none."""
    check_mtp_target(from_hf_config({**SHAPE, **GLM_LITE_RELEASED, "architectures": [GLM_LITE]}))
    with pytest.raises(ConfigError, match="needs MTP layers; this Glm4MoeLiteForCausalLM checkpoint has"):
        check_mtp_target(from_hf_config({**SHAPE, "architectures": [GLM_LITE]}))


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(mlp_layer_types=["dense", "sparse"]), r"mlp_layer_types \['dense', 'sparse'\] must give one of"),
        (dict(mlp_layer_types=["dense", "moe", "sparse"]), "must give one of .* for each of the 3 layers"),
        (dict(first_k_dense_replace=2), r"first_k_dense_replace 2 disagrees with the dense layers \[0\]"),
        (dict(partial_rotary_factor=0.5), "partial_rotary_factor 0.5 is not supported for Glm4MoeLiteForCausalLM"),
        (dict(scoring_func="softmax"), "scoring_func 'softmax' is not supported .* 'sigmoid' only"),
        (dict(topk_method="greedy"), "topk_method 'greedy' is not supported .* 'noaux_tc' only"),
        (dict(attention_bias=True), "attention_bias=True is not supported for Glm4MoeLiteForCausalLM"),
        (dict(n_group=3), "n_group 3 must divide the 64 routed experts"),
    ],
)
def test_glm4_moe_lite_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**SHAPE, **fields, "architectures": [GLM_LITE]})


MISTRAL4_LAYOUTS = [
    {},  # Mistral4Config's rope: YaRN x128 over 8192 positions, beta 0.1, 64 of each 128-dim head rotated
    dict(q_lora_rank=None, rope_interleave=False, first_k_dense_replace=2, n_routed_experts=8, n_group=2,
         topk_group=1, num_experts_per_tok=2, norm_topk_prob=False, routed_scaling_factor=2.0, qk_nope_head_dim=32,
         rope_parameters=dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=64, llama_4_scaling_beta=0.3,
                              partial_rotary_factor=2 / 3)),
]


YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64, llama_4_scaling_beta=0.1)


@pytest.mark.parametrize("fields", MISTRAL4_LAYOUTS)
def test_mistral4_fields_read_as_transformers_reads_them(fields):
    ours = from_hf_config({**SHAPE, **fields, "architectures": [MISTRAL4]})
    theirs = transformers.Mistral4Config(**SHAPE, **fields)
    _latent(ours, theirs)
    rope = theirs.rope_parameters
    assert ours.rotated_dims == int(theirs.head_dim * rope["partial_rotary_factor"]) == theirs.qk_rope_head_dim
    assert (ours.rope_theta, ours.rope_scaling.rope_type, ours.rope_scaling.factor) == (
        rope["rope_theta"], rope["rope_type"], rope["factor"])
    assert (ours.query_scale_beta, ours.query_scale_period) == (
        rope["llama_4_scaling_beta"], rope["original_max_position_embeddings"])
    scale = modeling_mistral4.yarn_apply_mscale(rope, theirs.qk_head_dim**-0.5)
    assert ours.attn_scale == pytest.approx(scale, rel=1e-12)
    assert (ours.dense_layers, ours.mtp_layers) == (tuple(range(theirs.first_k_dense_replace)), 0)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64)),
         "llama_4_scaling_beta None is not supported: Mistral4ForCausalLM scales queries by it"),
        (dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, llama_4_scaling_beta=0.1)),
         "rope type 'default' is not supported for Mistral4ForCausalLM: its query scaling reads"),
        (dict(rope_parameters=dict(YARN, partial_rotary_factor=1.0)),
         r"partial_rotary_factor 1.0 is not supported for Mistral4ForCausalLM: .* qk_rope_head_dim 64 of each 128"),
        (dict(rope_parameters=YARN, attention_bias=True), "attention_bias=True is not supported for Mistral4"),
        (dict(rope_parameters=YARN, n_group=2, topk_group=1, num_experts_per_tok=80),
         "num_experts_per_tok 80 is more than the 64 experts of the topk_group 1 groups"),
    ],
)
def test_mistral4_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**SHAPE, **fields, "architectures": [MISTRAL4]})


def test_mistral3_vision_model_runs_its_mistral4_text_config():
    """Mistral Small 4 ships as Mistral3ForConditionalGeneration around a mistral4 text_config (transformers' causal-LM
    map leaves mistral4 out): its language model reads as Mistral4ForCausalLM's config (the Pixtral tower:
    tests/test_pixtral.py)."""
    text = {**SHAPE, "rope_parameters": YARN}
    vision = {"architectures": ["Mistral3ForConditionalGeneration"], "text_config": {**text, "model_type": "mistral4"}}
    assert from_hf_config(vision) == from_hf_config({**text, "architectures": [MISTRAL4]})


def _large4(**text) -> dict:
    """A Mistral Large 4 config: the language model's settings under text_config, as the checkpoints nest them."""
    return {"architectures": ["MistralLarge4ForConditionalGeneration"], "text_config": {**SHAPE, **text}}


def test_mistral_large4_reads_its_text_config_with_transformers_defaults():
    """MistralLarge4TextConfig's defaults: every 4th layer NoPE, the first dense, all indexed (2048 tokens), YaRN
    x2048 over 512 positions without magnitude scaling, logits soft-capped at 30; one row [c, k_pe, index key]."""
    cfg = from_hf_config(_large4(num_hidden_layers=8))
    mla = cfg.latent_attention
    assert (cfg.nope_layers, cfg.dense_layers, cfg.final_soft_cap) == ((3, 7), (0,), 30.0)
    assert (mla.q_lora_rank, mla.indexer.index_topk, mla.indexer.rope_interleaved) == (0, 2048, True)
    assert cfg.head_dim == 512 + 64 + 128 and cfg.num_kv_heads == 1 and cfg.norm_topk_prob
    assert (cfg.rope_scaling.rope_type, cfg.rope_scaling.factor, cfg.rope_scaling.attention_factor) == ("yarn", 2048, 1)
    assert cfg.attn_scale == pytest.approx(128**-0.5)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(kv_source_layers=[0, 0, 2]), r"kv_source_layers \[0, 0, 2\] .* layers reading another's cache"),
        (dict(indexer_types=["full", "shared", "full"]), r"indexer_types .* each one of \('full',\)"),
        (dict(index_topk_freq=2), "index_topk_freq 2 .* every layer runs its own indexer"),
        (dict(mlp_layer_types=["dense", "moe", "sparse"]), r"mlp_layer_types .* \('dense', 'sparse'\)"),
        (dict(no_rope_layers=[1, 1]), r"no_rope_layers .* one entry per layer \(3\)"),
    ],
)
def test_mistral_large4_layouts_not_implemented_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config(_large4(**fields))


def test_mistral4_routing_matches_transformers_router():
    """Same experts and weights as Mistral4TopkRouter on random rows (softmax scores, groups by their two best; two
    of four groups open, not renormalised: the parity model's router has one open of two, renormalised)."""
    experts, groups, groups_per_token, k, renormalise, scaling = 16, 4, 2, 3, False, 1.5
    config = transformers.Mistral4Config(hidden_size=16, num_attention_heads=2, n_routed_experts=experts,
                                         n_group=groups, topk_group=groups_per_token, num_experts_per_tok=k,
                                         norm_topk_prob=renormalise, routed_scaling_factor=scaling)
    router = modeling_mistral4.Mistral4TopkRouter(config)
    torch.manual_seed(experts)
    with torch.no_grad():
        router.weight.normal_()
        logits, expected_weights, expected_experts = router(torch.randn(50, 16))
    route = jax.jit(grouped_topk, static_argnums=range(2, 7), static_argnames="softmax")
    weights, chosen = route(jnp.asarray(logits.numpy()), None, k, groups, groups_per_token, renormalise, scaling,
                            softmax=True)
    order, expected_order = np.argsort(np.asarray(chosen), -1), expected_experts.argsort(-1).numpy()
    np.testing.assert_array_equal(np.take_along_axis(np.asarray(chosen), order, -1),
                                  np.take_along_axis(expected_experts.numpy(), expected_order, -1))
    np.testing.assert_allclose(np.take_along_axis(np.asarray(weights), order, -1),
                               np.take_along_axis(expected_weights.numpy(), expected_order, -1), rtol=1e-6)


MINICPM3 = "MiniCPM3ForCausalLM"
LONGROPE = dict(rope_type="longrope", rope_theta=1e4, short_factor=[1.0] * 16, long_factor=[2.0] * 16,
                original_max_position_embeddings=1024)


@pytest.mark.parametrize("fields", [
    {},  # MiniCPM3-4B's defaults
    dict(scale_depth=None, dim_model_base=None, q_lora_rank=None, v_head_dim=None, scale_emb=1.0,
         max_position_embeddings=4096, rope_parameters=LONGROPE, tie_word_embeddings=False),
])
def test_minicpm3_fields_read_as_transformers_reads_them(fields):
    ours = from_hf_config({**SHAPE, **fields, "architectures": [MINICPM3]})
    theirs = hf.MiniCPM3Config(**SHAPE, **fields)  # skips where this transformers has no MiniCPM3
    mla = ours.latent_attention
    assert (mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.q_lora_rank) == (
        theirs.kv_lora_rank, theirs.qk_nope_head_dim, theirs.qk_rope_head_dim, theirs.v_head_dim,
        theirs.q_lora_rank or 0)
    assert (ours.num_kv_heads, ours.rotated_dims, ours.rope_interleaved) == (1, theirs.qk_rope_head_dim, False)
    assert ours.attn_scale == pytest.approx(theirs.qk_head_dim**-0.5, rel=1e-12)
    assert ours.embedding_multiplier == theirs.scale_emb and ours.logits_scaling == theirs.logits_scaling
    assert ours.residual_multiplier == pytest.approx(theirs.scale_depth / math.sqrt(theirs.num_hidden_layers))
    assert ours.rope_scaling.rope_type == theirs.rope_parameters["rope_type"]
    assert (ours.rms_norm_eps, ours.max_position_embeddings, ours.tie_word_embeddings, ours.activation) == (
        theirs.rms_norm_eps, theirs.max_position_embeddings, theirs.tie_word_embeddings, theirs.hidden_act)
    assert ours.num_experts == 0 and ours.dense_layers == ()


@pytest.mark.parametrize("fields,message", [
    (dict(rope_parameters=dict(rope_type="yarn", factor=4.0)), "rope type 'yarn' is not supported for MiniCPM3"),
    (dict(rope_parameters=dict(LONGROPE, short_factor=[1.0] * 8)), "short_factor has 8 entries; LongRoPE needs one"),
    (dict(attention_bias=True), "attention_bias=True is not supported for MiniCPM3ForCausalLM"),
    (dict(dim_model_base=0), "dim_model_base 0 must be positive"),
])
def test_minicpm3_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**SHAPE, **fields, "architectures": [MINICPM3]})


LONGCAT = dict(architectures=["LongcatFlashForCausalLM"], vocab_size=8, hidden_size=64, num_layers=2,
               num_attention_heads=2, kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=4,
               v_head_dim=8, ffn_hidden_size=24, expert_ffn_hidden_size=8, n_routed_experts=4, zero_expert_num=2,
               moe_topk=3)


def test_longcat_flash_reads_two_halves_a_layer_and_its_lora_scales():
    """Each checkpoint layer runs two decoder layers (each its own cache) whose first half names the MoE's tensors;
    the query scaled by sqrt(hidden / q_lora_rank), the latent by sqrt(hidden / kv_lora_rank); zero experts
    counted apart; a model.mtp tensor and a saved zero expert's gate are not read; the refusals."""
    from jaxinfer.checkpoint.hf_names import unread_tensor
    from jaxinfer.models.longcat_flash import layer_hf_leaves

    cfg = from_hf_config(LONGCAT)
    mla = cfg.latent_attention
    assert (cfg.num_layers, cfg.num_experts, cfg.zero_experts, cfg.experts_per_token) == (4, 4, 2, 3)
    assert (mla.q_scale, mla.latent_scale, cfg.attn_scale, cfg.rope_theta) == (math.sqrt(2), 2.0, 12**-0.5, 1e7)
    assert layer_hf_leaves(cfg, 3)["wq"].name == "model.layers.1.self_attn.1.q_b_proj.weight"
    assert "router" in layer_hf_leaves(cfg, 2) and "router" not in layer_hf_leaves(cfg, 3)
    assert unread_tensor(cfg, "model.mtp.layers.0.norm.weight")
    assert unread_tensor(cfg, "model.layers.0.mlp.experts.5.up_proj.weight")
    assert not unread_tensor(cfg, "model.layers.0.mlp.experts.3.up_proj.weight")
    for fields, message in ((dict(router_bias=True), "router_bias True is not supported"),
                            (dict(q_lora_rank=0), "q_lora_rank 0 is not supported"),
                            (dict(qk_head_dim=16), r"qk_head_dim 16 is not supported .* \(12\)")):
        with pytest.raises(ConfigError, match=message):
            from_hf_config({**LONGCAT, **fields})
