"""Every supported architecture against HF transformers on the same tiny random weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_models import ARCH_CONFIGS, make_hf_model
from jaxinfer import LLM, SamplingParams

ARCHS = sorted(ARCH_CONFIGS)
PROMPT = np.random.RandomState(0).randint(3, 256, size=64).tolist()


@pytest.fixture(scope="module", params=ARCHS)
def arch_pair(request, checkpoint_dir):
    """(name, HF torch model, jaxinfer LLM in float32) for one architecture."""
    name = request.param
    return name, make_hf_model(name), LLM(checkpoint_dir(name), dtype="float32", max_seq_len=128)


def test_logits_match_hf(arch_pair):
    name, hf, llm = arch_pair
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0].numpy()
    got = llm.logits(PROMPT)
    assert got.shape == expected.shape == (64, 256)
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() <= 1e-4 * max(1.0, scale), name


def test_greedy_tokens_match_hf_generate(arch_pair):
    name, hf, llm = arch_pair
    prompt = PROMPT[:12]
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :].tolist()
    out = llm.generate([prompt], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))[0]
    assert out.token_ids == ref, name
    assert out.finish_reason == "length"


@pytest.mark.parametrize("name", ["llama3", "gemma", "qwen3"])
def test_bfloat16_loads_and_tracks_float32(name, checkpoint_dir):
    llm = LLM(checkpoint_dir(name), dtype="bfloat16", max_seq_len=128)
    assert llm.weights.embed.dtype == np.dtype("bfloat16")
    out = llm.generate([PROMPT[:12]], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 16
    reference = LLM(checkpoint_dir(name), dtype="float32", max_seq_len=128).logits(PROMPT)
    got = llm.logits(PROMPT)
    assert np.abs(got - reference).max() < 0.1 * np.abs(reference).max()
