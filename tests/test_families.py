"""The families beyond Llama through the engine: prefix caching on and off, speculative decoding with
one as the target, LongRoPE past the original context, quantization and convert. (HF parity of each family's logits and greedy tokens is
test_hf_parity's; expert parallelism is test_expert_parallel's.)"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hf_models import ENGINE_TESTED, make_hf_model, save_hf_model

from jaxinfer import LLM, SamplingParams, SpeculativeConfig, save_converted

FAMILIES = list(ENGINE_TESTED)
PROMPT = np.random.RandomState(0).randint(3, 256, size=64).tolist()
# Two prompts sharing 20 tokens (a full page of 16), both longer than the sliding windows (8, 16).
SHARED = PROMPT[:20]
PROMPTS = [SHARED + PROMPT[40:44], SHARED + PROMPT[50:58]]
GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
# With caching on, the second call computes 20 of its prompts' tokens (a page of each is cached): a 32-token step, a
# second ragged program to compile beside the first call's 64-token one. A 40-token prompt no page holds, sampled
# once, fills that step to the first call's bucket (one ragged program an engine: ~0.4 s of compiling from an empty
# cache); it finishes in its prefill step, so the other two still decode as two rows.
FILLER = PROMPT[24:64]


@functools.cache
def hf_greedy(name: str, prompt: tuple[int, ...], tokens: int = 32) -> list[int]:
    """HF's `tokens` greedy tokens after `prompt`."""
    with torch.no_grad():
        out = make_hf_model(name).generate(torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def generate_twice_with_a_cached_page(llm: LLM, name: str) -> None:
    """Two calls over PROMPTS, each giving HF's greedy tokens; the second (which reads a cached page of each
    prompt when caching is on) with FILLER's one token beside them then."""
    expected = [hf_greedy(name, tuple(p)) for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected, name
    filler = [FILLER] if llm.engine.config.enable_prefix_caching else []
    params = [GREEDY] * len(PROMPTS) + [SamplingParams(max_tokens=1, temperature=0)] * len(filler)
    outs = llm.generate(PROMPTS + filler, params)
    assert [o.outputs[0].token_ids for o in outs] == expected + [hf_greedy(name, tuple(FILLER), 1)] * len(filler), name


def _relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(got - expected).max() / np.abs(expected).max())


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix-cache", "no-prefix-cache"])
def test_engine_greedy_matches_hf_with_shared_prefixes(checkpoint_dir, name, prefix_caching):
    """32 greedy tokens for two calls over prompts sharing a page (the second call hits the cache when it
    is on): with the native CPU kernels where they build and caching on, on XLA's path with it off.
    (test_hf_parity leaves these families' greedy tokens to this test.)"""
    llm = LLM(checkpoint_dir(name), dtype="float32", max_seq_len=128, enable_prefix_caching=prefix_caching,
              cpu_kernels=None if prefix_caching else False)
    generate_twice_with_a_cached_page(llm, name)
    hits = llm.metrics().get("prefix_cache_hits", 0)
    assert (hits > 0) == prefix_caching, hits


def test_gpt_oss_through_the_gpu_kernel_keeps_hf_greedy_tokens(checkpoint_dir):
    """The attention sinks inside the Triton paged kernel (interpreted): decode and prefill rows."""
    llm = LLM(checkpoint_dir("gpt_oss"), dtype="float32", max_seq_len=64, attention_backend="pallas",
              interpret_kernels=True)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    expected = [hf_greedy("gpt_oss", tuple(p))[:8] for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == expected


@pytest.mark.parametrize("name", ["gemma2", "mixtral"])  # sliding windows and soft caps; routed experts
def test_speculative_target_keeps_hf_greedy_tokens(checkpoint_dir, name):
    """Prompt lookup drafting for the family in the engine's verify steps: HF's greedy tokens, drafts proposed."""
    loop = [21, 22, 23, 24, 25, 26] * 4  # prompt lookup finds runs to copy here
    prompts = [loop, PROMPTS[0]]
    llm = LLM(checkpoint_dir(name), dtype="float32", max_seq_len=128,
              speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=3, adaptive=False))
    outs = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(name, tuple(p)) for p in prompts], name
    assert llm.metrics()["spec_decode_num_draft_tokens"] > 0


def test_phi3_long_context_rope_and_partial_rotary_match_hf(tmp_path):
    """Served past the original context, LongRoPE takes its long factors, as HF does for a prompt that long."""
    overrides = dict(original_max_position_embeddings=32, partial_rotary_factor=0.5,
                     rope_scaling=dict(type="longrope", short_factor=[1.0] * 24,
                                       long_factor=[1.0 + i / 4 for i in range(24)]))
    path = save_hf_model("phi3", tmp_path, **overrides)
    with torch.no_grad():  # 64 tokens > 32: HF rotates every position with the long factors
        expected = make_hf_model("phi3", **overrides)(torch.tensor([PROMPT])).logits[0].numpy()
    llm = LLM(path, dtype="float32", max_seq_len=128, cpu_kernels=False)
    assert llm.config.rope_scaling.long and llm.config.rotated_dims == 48
    assert _relative_error(llm.logits(PROMPT), expected) <= 1e-5


# a sandwich-norm layer; MoE layers (experts quantized too); latent attention (its per-head W_UK, W_UV kept as loaded)
@pytest.mark.parametrize("name", ["gemma2", "mixtral", "deepseek_v2"])
def test_int8_quantized_model_converts_and_restores_identically(checkpoint_dir, name, tmp_path):
    """int8 projections (and experts) stay close to float32; the converted checkpoint gives the same logits."""
    path = checkpoint_dir(name)
    with torch.no_grad():
        expected = make_hf_model(name)(torch.tensor([PROMPT])).logits[0].numpy()
    llm = LLM(path, dtype="float32", max_seq_len=128, quantization="int8")
    logits = llm.logits(PROMPT)
    assert _relative_error(logits, expected) < 0.05, name
    out = save_converted(llm.weights, path, tmp_path / "converted")
    np.testing.assert_array_equal(LLM(out, max_seq_len=128).logits(PROMPT), logits)


def test_bloom_alibi_through_the_paged_cache_keeps_hf_greedy_tokens(checkpoint_dir):
    """BLOOM (ALiBi): 32 greedy tokens for two calls over prompts sharing a page, prefix caching on (the second call
    reads cached pages), the native CPU kernels where they build: its attention leaves them for XLA's paged paths
    (the ragged step's blocked key loops), whose biases take each key's position from the page table."""
    llm = LLM(checkpoint_dir("bloom"), dtype="float32", max_seq_len=128, enable_prefix_caching=True)
    generate_twice_with_a_cached_page(llm, "bloom")
    assert llm.metrics().get("prefix_cache_hits", 0) > 0
