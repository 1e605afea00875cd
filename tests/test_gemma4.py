"""Gemma 4 (text) against transformers on the same tiny saved weights: float32 logits, the engine's greedy tokens
with a prefix-cache hit, the KV-sharing layers keeping no pages, the text model of a Gemma4ForConditionalGeneration
checkpoint, and the settings refused by name. One LLM per module (the parametrized family tests would run six)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import torch
import transformers
from hf_models import COMMON, OWN_MODULE_CONFIGS, make_hf_model

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.paged import page_bytes
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import from_hf_config

PROMPT = np.random.RandomState(0).randint(3, 256, size=64).tolist()
# Two prompts sharing 20 tokens (a full page of 16), both longer than the window (8); the second's 20 tokens past
# the cached page and the first's 24 fill the same step shape (one prefill program).
PROMPTS = [PROMPT[:20] + PROMPT[40:44], PROMPT[:20] + PROMPT[44:60]]


@pytest.fixture(scope="module")
def hf_model() -> torch.nn.Module:
    return make_hf_model("gemma4")


@pytest.fixture(scope="module")
def llm(checkpoint_dir) -> LLM:
    """One sequence at a time (fewer step programs to compile), so the second prompt finds the first's page."""
    return LLM(checkpoint_dir("gemma4"), dtype="float32", max_seq_len=128, max_num_seqs=1, enable_prefix_caching=True)


def _relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(got - expected).max() / np.abs(expected).max())


def test_logits_match_hf(llm, hf_model):
    """Every position's logits: sliding and global layers of their own head dims, values = keys on the global
    ones, layers 2-3 over layers 0-1's K/V, per-layer inputs, the MoE block, layer scalars, the soft cap."""
    with torch.no_grad():
        expected = hf_model(torch.tensor([PROMPT])).logits[0].numpy()
    assert _relative_error(llm.logits(PROMPT), expected) <= 1e-5


def test_engine_greedy_matches_hf_with_a_prefix_cache_hit(llm, hf_model):
    """Prompts sharing a page, past the window, run one after the other: the second starts from the first's cached
    page (which holds only the storing layers' K/V); HF's greedy tokens for both."""
    with torch.no_grad():
        expected = [hf_model.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                                      pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert llm.metrics()["prefix_cache_hits"] == 16


def test_dense_config_logits_match_hf(checkpoint_dir):
    """Without KV sharing, per-layer inputs, experts or k_eq_v (every layer its v_proj), global layers still wider."""
    with torch.no_grad():
        expected = make_hf_model("gemma4_dense")(torch.tensor([PROMPT])).logits[0].numpy()
    got = LLM(checkpoint_dir("gemma4_dense"), dtype="float32", max_seq_len=128).logits(PROMPT)
    assert _relative_error(got, expected) <= 1e-5


def test_kv_sharing_layers_keep_no_pages(llm, checkpoint_dir):
    """Layers 2 and 3 read layers 0 and 1's pages: theirs are empty and a page's bytes count layers 0 and 1 only,
    each at its own shape (2 kv heads of 8 dims; 1 of 16). Page copies, which stack the layers, are refused."""
    cfg = llm.config
    assert [cfg.kv_source(i) for i in range(4)] == [0, 1, 0, 1]
    assert [cfg.kv_shape(i) for i in range(4)] == [(2, 8), (1, 16)] * 2
    assert page_bytes(cfg, 16, np.float32) == 2 * 16 * 4 * (2 * 8 + 1 * 16)
    with pytest.raises(ConfigError, match="kv_offloading_size"):
        LLM(checkpoint_dir("gemma4"), dtype="float32", max_seq_len=128, kv_offloading_size=0.001)


def test_prompt_embeds_are_refused(checkpoint_dir):
    """The per-layer inputs read each token's id; a prompt_embeds prompt has placeholders only."""
    with pytest.raises(ConfigError, match="enable_prompt_embeds"):
        LLM(checkpoint_dir("gemma4"), dtype="float32", max_seq_len=128, enable_prompt_embeds=True)


def test_conditional_generation_checkpoint_reads_its_language_model(tmp_path, checkpoint_dir):
    """Google's layout: `model.language_model.*` beside an image tower and its embedder (skipped), the text config
    under text_config: the same config and weights as the causal LM's checkpoint."""
    config_cls, extra = OWN_MODULE_CONFIGS["gemma4"]
    text = config_cls(**{**COMMON, **extra})
    vision = transformers.Gemma4VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(0)
    hf = transformers.Gemma4ForConditionalGeneration(transformers.Gemma4Config(text_config=text,
                                                                              vision_config=vision))
    hf.model.language_model.load_state_dict(make_hf_model("gemma4").model.state_dict())
    hf.save_pretrained(tmp_path)
    cfg, weights = load_weights(tmp_path, np.float32, progress=False)
    causal_cfg, causal = load_weights(checkpoint_dir("gemma4"), np.float32, progress=False)
    assert cfg == dataclasses.replace(causal_cfg, architecture="Gemma4ForConditionalGeneration")
    assert len(jax.tree.leaves(weights)) == len(jax.tree.leaves(causal))
    for ours, theirs in zip(jax.tree.leaves(weights), jax.tree.leaves(causal)):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


@pytest.mark.parametrize("setting, value", [("use_bidirectional_attention", "all"), ("attention_bias", True),
                                            ("vocab_size_per_layer_input", 128), ("num_kv_shared_layers", 4)])
def test_unsupported_settings_are_refused_by_name(setting, value):
    """Bidirectional attention, attention biases, a per-layer vocabulary of its own, every layer sharing."""
    config_cls, extra = OWN_MODULE_CONFIGS["gemma4"]
    hf = {**config_cls(**{**COMMON, **extra}).to_dict(), "architectures": ["Gemma4ForCausalLM"], setting: value}
    with pytest.raises(ConfigError, match=setting):
        from_hf_config(hf)
