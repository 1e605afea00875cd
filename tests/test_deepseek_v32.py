"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) beyond test_hf_parity's runs of deepseek_v32: GLM-5's logits,
the engine's greedy tokens through chunked prefill and prefix caching, and the settings refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from accelerator_programs import lowered_kernels
from engine_knobs import ENGINE
from hf_models import ARCH_CONFIGS, make_hf_model, save_hf_model

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import from_hf_config
from jaxinfer.models.sparse_latent_attention import block_tokens

PROMPT = np.random.RandomState(0).randint(3, 256, size=64).tolist()
# 40 shared tokens (two full pages of 16), then 8 of each prompt's own: 48 tokens, prefilled in 32-token steps (every
# step a full 32-token one and the two rows decoding together: two step programs to compile), every query past the
# first 8 attending 8 of its keys.
PROMPTS = [PROMPT[:48], PROMPT[:40] + PROMPT[50:58]]


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory: pytest.TempPathFactory):
    """A one-layer DeepSeek-V3.2 (its dense MLP; the experts are test_hf_parity's): the engine's step programs
    compile per layer."""
    return save_hf_model("deepseek_v32", tmp_path_factory.mktemp("dsa"), num_hidden_layers=1)


def test_glm5_logits_match_hf(checkpoint_dir):
    """GLM-5 (GlmMoeDsaForCausalLM, one MoE layer): DeepSeek-V3.2's indexer with adjacent-pair rotary, float32
    logits as HF's."""
    with torch.no_grad():
        expected = make_hf_model("glm_moe_dsa")(torch.tensor([PROMPT])).logits[0].numpy()
    got = LLM(checkpoint_dir("glm_moe_dsa"), dtype="float32", max_seq_len=128, cpu_kernels=False).logits(PROMPT)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_engine_greedy_matches_hf_through_chunked_prefill_and_prefix_cache(one_layer):
    """Two calls of two 48-token prompts (32-token steps: chunked prefill past index_topk); the second call's
    prompts start from the first's cached pages, whose rows carry their index keys: HF's greedy tokens."""
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    with torch.no_grad():  # the prompts are as long: one batch, no padding
        out = make_hf_model("deepseek_v32", num_hidden_layers=1).generate(
            torch.tensor(PROMPTS), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    expected = out[:, len(PROMPTS[0]):].tolist()
    llm = LLM(one_layer, **ENGINE, enable_prefix_caching=True)
    for _ in range(2):
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == expected
    assert llm.metrics()["prefix_cache_hits"] > 0


def test_step_programs_lower_for_the_accelerators(one_layer):
    """Every engine step program lowers for CUDA and TPU (jax.export): the sparse attention is XLA gathers and one
    top_k, no kernel. One row and 16-token steps: a ragged and a decode program (the sparse path is the same in
    every program; more rows only add programs to lower)."""
    llm = LLM(one_layer, dtype="float32", max_seq_len=128, max_num_seqs=1, max_num_batched_tokens=16,
              decode_steps=4, num_pages=24, attention_backend="pallas", cpu_kernels=False)
    for platform in ("gpu", "tpu"):
        assert len(lowered_kernels(llm, platform)) == len(llm.engine.step_hosts()) == 2


def test_long_contexts_score_fewer_tokens_a_block():
    """A block's index scores stay within SCORE_BUDGET: 16 tokens over short contexts, 2 at DeepSeek-V3.2's 64
    heads over 128k positions, 1 beyond."""
    assert [block_tokens(t, s, 64) for t, s in [(100, 96), (5, 96), (100, 1 << 17), (100, 1 << 22)]] == [16, 5, 2, 1]


def _hf_config(**overrides) -> dict:
    config_cls, fields = ARCH_CONFIGS["deepseek_v32"]
    return {**config_cls(**{**fields, "num_hidden_layers": 2}).to_dict(), "architectures": ["GlmMoeDsaForCausalLM"],
            **overrides}


@pytest.mark.parametrize("overrides, named", [
    (dict(indexer_types=["full", "shared"]), "indexer_types"),
    (dict(index_topk_freq=2), "index_topk_freq"),
    (dict(q_lora_rank=None), "q_lora_rank"),
    (dict(mlp_layer_types=["sparse", "sparse"]), "mlp_layer_types"),
])
def test_unsupported_settings_are_refused_by_name(overrides, named):
    with pytest.raises(ConfigError, match=named):
        from_hf_config(_hf_config(**overrides))


def test_older_transformers_layer_types_spelling_is_read():
    """transformers 5.17's configs name the indexed layer "deepseek_sparse_attention" (later ones "indexed_attention"):
    the same layout, read alike."""
    cfg = from_hf_config(_hf_config(layer_types=["deepseek_sparse_attention"] * 2))
    assert cfg == from_hf_config(_hf_config(layer_types=["indexed_attention"] * 2))
