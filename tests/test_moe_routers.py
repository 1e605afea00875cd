"""The routers other MoE families do not share, against transformers' own routing code on the same logits:
Phi-3.5-MoE's sparsemixer, DBRX's p-normalised top k, Cohere2-MoE's top-k softmax or sigmoids; and the settings
of those families' configs that cannot run, refused by name."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import transformers

from jaxinfer import ConfigError, from_hf_config
from jaxinfer.models.cohere2_moe import routing
from jaxinfer.models.dbrx import p_normalised
from jaxinfer.models.sparsemixer import sparsemixer

# Router logits of 16 experts: random, some rows with the best two (or three) within the jitter threshold's reach
LOGITS = np.random.RandomState(0).randn(64, 16).astype(np.float32)
LOGITS[:8, :3] = LOGITS[:8, :1] * np.array([1.0, 0.99, 0.98], np.float32)  # near ties: several logits kept
LOGITS[8:12] = -np.abs(LOGITS[8:12])  # all negative: the gap is scaled by |logit|, not by the best


@pytest.mark.parametrize("jitter_eps", [0.01, 0.1, 0.5])
def test_sparsemixer_matches_transformers_inference_path(jitter_eps):
    phimoe = pytest.importorskip("transformers.models.phimoe.modeling_phimoe")
    weights, experts = phimoe.sparsemixer(torch.tensor(LOGITS), jitter_eps=jitter_eps, training=False, top_k=2)
    got_weights, got_experts = sparsemixer(LOGITS, jitter_eps)
    np.testing.assert_array_equal(np.asarray(got_experts), experts.numpy())
    np.testing.assert_allclose(np.asarray(got_weights), weights.numpy(), rtol=1e-6, atol=1e-7)
    assert (np.asarray(got_weights) < 0.99).any()  # some weights are softmaxes over several logits


PHIMOE = dict(architectures=["PhiMoEForCausalLM"], vocab_size=8, hidden_size=16, intermediate_size=8,
              num_hidden_layers=2, num_attention_heads=2, num_local_experts=4)
LONGROPE = dict(type="longrope", short_factor=[1.0] * 4, long_factor=[2.0] * 4, original_max_position_embeddings=64)


def test_phimoe_reads_the_mscale_as_the_rope_attention_factor():
    cfg = from_hf_config({**PHIMOE, "rope_scaling": dict(LONGROPE, short_mscale=1.25, long_mscale=1.25)})
    assert cfg.rope_scaling.attention_factor == 1.25 and cfg.router_jitter_eps == 0.01 and cfg.layer_norm


@pytest.mark.parametrize("fields,message", [
    (dict(num_experts_per_tok=3), "num_experts_per_tok 3 is not supported for PhiMoEForCausalLM: sparsemixer"),
    (dict(rope_scaling=dict(LONGROPE, short_mscale=1.0, long_mscale=1.2)), "short_mscale 1.0 and long_mscale 1.2"),
    (dict(rope_scaling=dict(type="yarn", factor=2.0)), "rope type 'yarn' is not supported for Phi-3.5-MoE"),
])
def test_phimoe_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**PHIMOE, **fields})


@pytest.mark.parametrize("p", [1.0, 2.0, 0.5, None])
def test_dbrx_routing_matches_transformers(p):
    dbrx = pytest.importorskip("transformers.models.dbrx.modeling_dbrx")
    if not hasattr(dbrx.DbrxFFN, "route_tokens_to_experts"):
        pytest.skip(f"transformers {transformers.__version__} routes inside DbrxRouter (no route_tokens_to_experts)")
    config = transformers.DbrxConfig(d_model=16, n_heads=2, n_layers=1, ffn_config=dict(
        ffn_hidden_size=8, moe_num_experts=16, moe_top_k=4, moe_normalize_expert_weights=p))
    weights, experts = dbrx.DbrxFFN(config).route_tokens_to_experts(torch.tensor(LOGITS))
    got_weights, got_experts = jax.lax.top_k(jax.nn.softmax(LOGITS), 4)
    got_weights = p_normalised(got_weights, 0.0 if p is None else p)
    np.testing.assert_array_equal(np.asarray(got_experts), experts.numpy())
    np.testing.assert_allclose(np.asarray(got_weights), weights.numpy(), rtol=1e-6, atol=1e-7)


DBRX = dict(architectures=["DbrxForCausalLM"], vocab_size=8, d_model=16, n_heads=2, n_layers=2)


def test_dbrx_reads_its_nested_config():
    cfg = from_hf_config({**DBRX, "attn_config": dict(kv_n_heads=1, clip_qkv=8, rope_theta=5e5),
                          "ffn_config": dict(ffn_hidden_size=12, moe_num_experts=16, moe_top_k=4)})
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.clip_qkv, cfg.rope_theta) == (1, 8, 8.0, 5e5)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size) == (16, 4, 12)
    assert cfg.expert_weights_p_norm == 1.0 and cfg.layer_norm and not cfg.norm_bias and not cfg.norm_topk_prob


@pytest.mark.parametrize("fields,message", [
    (dict(ffn_config=dict(moe_normalize_expert_weights=0)), "moe_normalize_expert_weights 0 must be a positive p"),
    (dict(attn_config=dict(clip_qkv=-1)), "clip_qkv -1 must be positive or null"),
    (dict(tie_word_embeddings=True), "tie_word_embeddings=True is not supported for DbrxForCausalLM"),
])
def test_dbrx_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**DBRX, **fields})


@pytest.mark.parametrize("selection,norm", [("softmax", True), ("sigmoid", True), ("sigmoid", False)])
def test_cohere2_moe_routing_matches_transformers(selection, norm):
    """The top-k router logits' softmax, or their sigmoids (renormalised with norm_topk_prob), as
    Cohere2MoeTopKRouter weighs them."""
    cohere2_moe = pytest.importorskip("transformers.models.cohere2_moe.modeling_cohere2_moe")
    fields = dict(COHERE2_MOE, num_experts=16, num_experts_per_tok=4, expert_selection_fn=selection,
                  norm_topk_prob=norm)
    router = cohere2_moe.Cohere2MoeTopKRouter(transformers.Cohere2MoeConfig(**fields))
    with torch.no_grad():
        router.weight.copy_(torch.eye(16))
        _, weights, experts = router(torch.tensor(LOGITS))
    got_weights, got_experts = routing(LOGITS, np.eye(16, dtype=np.float32), from_hf_config(fields))
    np.testing.assert_array_equal(np.asarray(got_experts), experts.numpy())
    np.testing.assert_allclose(np.asarray(got_weights), weights.numpy(), rtol=1e-6, atol=1e-7)


COHERE2_MOE = dict(architectures=["Cohere2MoeForCausalLM"], vocab_size=8, hidden_size=16, intermediate_size=8,
                   num_hidden_layers=4, num_attention_heads=2, head_dim=8)


def test_cohere2_moe_config_as_transformers_builds_it():
    """Without layer_types / mlp_layer_types: the first first_k_dense_replace layers dense and full with rope (the
    prefix pattern 1), then every sliding_window_pattern-th full and NoPE; LayerNorms unless rms_norm_eps is set;
    the shared experts' width, averaged in by default; unknown router and combination settings refused by name."""
    cfg = from_hf_config({**COHERE2_MOE, "first_k_dense_replace": 1, "sliding_window_pattern": 2,
                          "num_shared_experts": 2, "prefix_dense_intermediate_size": 24})
    assert (cfg.dense_layers, cfg.layer_windows, cfg.nope_layers) == ((0,), (0, 4096, 0, 4096), (2,))
    assert (cfg.intermediate_size, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size) == (24, 8, 16)
    assert cfg.layer_norm and cfg.shared_expert_average and not cfg.sigmoid_top_k and cfg.logits_scaling == 16.0
    assert not from_hf_config({**COHERE2_MOE, "rms_norm_eps": 1e-5}).layer_norm
    for name in ("expert_selection_fn", "shared_expert_combination_strategy"):
        with pytest.raises(ConfigError, match=f"{name} 'max' is not supported for Cohere2MoeForCausalLM"):
            from_hf_config({**COHERE2_MOE, name: "max"})
