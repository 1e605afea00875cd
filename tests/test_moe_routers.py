"""The routers other MoE families do not share, against transformers' own routing code on the same logits:
Phi-3.5-MoE's sparsemixer; and the settings of those families' configs that cannot run, refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jaxinfer import ConfigError, from_hf_config
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
