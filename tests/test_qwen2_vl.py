"""Qwen2-VL and Qwen2.5-VL against HF transformers on the same tiny weights: text prompts through the language
model (M-RoPE with its three position streams equal is Qwen2's rope), every position's logits and greedy tokens
through LLM.generate; configs nested (transformers 5) and flat (the hub's) read alike."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from qwen2_vl_models import CLASSES, MROPE_SECTION, save_tiny_qwen2_vl

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import from_hf_config

KINDS = ["qwen2_vl", "qwen2_5_vl"]
TEXT = "The quick brown fox jumps over the lazy dog"
GREEDY = SamplingParams(max_tokens=8, temperature=0)
KNOBS = dict(dtype="float32", max_seq_len=128, max_num_batched_tokens=16, page_size=4, num_pages=40, max_num_seqs=2,
             limit_mm_per_prompt={"image": 2})


@pytest.fixture(scope="module", params=KINDS)
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, kind):
    return save_tiny_qwen2_vl(tmp_path_factory.mktemp(kind), kind)


@pytest.fixture(scope="module")
def hf_model(model_dir, kind):
    return CLASSES[kind][1].from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, **KNOBS)


def test_text_logits_and_greedy_match_hf(llm, hf_model):
    """A text prompt: every position's float32 logits within 1e-5 of the largest, greedy tokens HF's."""
    ids = llm.tokenizer.encode(TEXT)
    with torch.no_grad():
        expected = hf_model(input_ids=torch.tensor([ids])).logits[0].numpy()
        hf_tokens = hf_model.generate(input_ids=torch.tensor([ids]), max_new_tokens=GREEDY.max_tokens,
                                      do_sample=False)[0, len(ids):].tolist()
    got = llm.logits(ids)
    assert llm.config.mrope_section == tuple(MROPE_SECTION)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    assert llm.generate(TEXT, GREEDY)[0].outputs[0].token_ids == hf_tokens


def test_flat_hub_config_reads_as_nested(model_dir):
    """The hub's flat config (text fields at the top, rope_scaling type "mrope") gives the same ModelConfig."""
    nested = json.loads((model_dir / "config.json").read_text())
    text = nested["text_config"]
    flat = {**{k: v for k, v in nested.items() if k != "text_config"}, **text,
            "rope_theta": text["rope_parameters"]["rope_theta"],
            "rope_scaling": {"type": "mrope", "mrope_section": MROPE_SECTION}}
    flat.pop("rope_parameters")
    assert from_hf_config(flat) == from_hf_config(nested)


def test_bad_mrope_refused(model_dir):
    hf = json.loads((model_dir / "config.json").read_text())
    bad = {**hf, "text_config": {**hf["text_config"], "rope_parameters": {"rope_type": "default",
                                                                          "mrope_section": [2, 3, 4]}}}
    with pytest.raises(ConfigError, match=r"mrope_section \[2, 3, 4\] must add up to the 8"):
        from_hf_config(bad)
    yarn = {**hf, "text_config": {**hf["text_config"], "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}}
    with pytest.raises(ConfigError, match="rope type 'yarn' is not supported for Qwen2"):
        from_hf_config(yarn)
