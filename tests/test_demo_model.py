"""The demo model shipped in the repo: HF-loadable, golden greedy parity with HF, int8 KV agreement."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from jaxinfer import LLM, SamplingParams
from jaxinfer.entrypoints.llm import DEMO_MODEL

DRAFT = DEMO_MODEL.parent / "draft"
GOLDEN_PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n\n", "class Stack:\n    def __init__(self):\n"]


@pytest.fixture(scope="module")
def demo_llm():
    return LLM(dtype="float32", max_seq_len=256)


@pytest.mark.parametrize("prompt", GOLDEN_PROMPTS)
def test_greedy_output_equals_hf_transformers(prompt, demo_llm):
    hf = transformers.AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32).eval()
    ids = demo_llm.tokenize(prompt)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(ids):].tolist()
    out = demo_llm.generate(prompt, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))[0]
    assert out.token_ids == ref


def test_default_model_is_the_demo_and_writes_python(demo_llm):
    assert demo_llm.model_dir == DEMO_MODEL
    out = demo_llm.generate("def add(a, b):\n", SamplingParams(max_tokens=24, temperature=0))[0]
    assert len(out.token_ids) == 24 and out.text == demo_llm.tokenizer.decode(out.token_ids)
    # It continues the function: a body, every line indented under the def.
    lines = [line for line in out.text.splitlines() if line.strip()]
    assert len(lines) >= 2 and all(line.startswith("    ") for line in lines), out.text


def test_draft_shares_the_tokenizer():
    target = transformers.AutoTokenizer.from_pretrained(DEMO_MODEL)
    draft = transformers.AutoTokenizer.from_pretrained(DRAFT)
    assert target.get_vocab() == draft.get_vocab()
    assert transformers.AutoConfig.from_pretrained(DRAFT).vocab_size == transformers.AutoConfig.from_pretrained(
        DEMO_MODEL).vocab_size


def test_int8_kv_cache_keeps_greedy_agreement(demo_llm):
    prompts = ["def parse(line):\n", "for key, value in items:\n", "    return self._cache[name]\n"]
    params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    reference = demo_llm.generate(prompts, params)
    int8 = LLM(dtype="float32", max_seq_len=256, kv_cache_dtype="int8")
    quantized = int8.generate(prompts, params)
    same = [np.mean(np.array(a.token_ids) == np.array(b.token_ids)) for a, b in zip(reference, quantized)]
    assert np.mean(same) >= 0.95, same
