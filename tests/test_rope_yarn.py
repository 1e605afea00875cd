"""YaRN rotary scaling: frequencies and attention factor as transformers computes them, and one tiny
Qwen2 with yarn rope parameters against HF end to end."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers
from hf_models import make_hf_model, save_hf_model
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.model import rope_fields
from jaxinfer.models.rope import attention_factor, rope_inv_freq

QWEN25 = dict(rope_theta=1e6, max_position_embeddings=32768,
              rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
LLAMA64 = dict(head_dim=64, max_position_embeddings=131072)


def _yarn(rope: dict, **top) -> dict:
    """A config.json-style dict of a head_dim 64 model with the given yarn rope parameters."""
    return {**LLAMA64, **top, "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, **rope}}


CONFIGS = {  # name -> (transformers config class, HF config dict)
    "qwen2.5-transformers4": (transformers.Qwen2Config, QWEN25),
    "qwen3-transformers5": (transformers.Qwen3Config, dict(
        head_dim=128, max_position_embeddings=131072,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                         "original_max_position_embeddings": 32768},
    )),
    "gpt-oss-untruncated": (transformers.GptOssConfig, dict(
        max_position_embeddings=131072,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
    )),
    "deepseek-mscale": (transformers.LlamaConfig, _yarn(dict(
        factor=40.0, mscale=1.0, mscale_all_dim=0.5, original_max_position_embeddings=4096))),
    "factor-null-from-contexts": (transformers.LlamaConfig, _yarn(dict(
        factor=None, mscale=0.707, mscale_all_dim=0.707, original_max_position_embeddings=4096))),
    "attention-factor-given": (transformers.LlamaConfig, _yarn(dict(
        factor=2.0, attention_factor=0.5, beta_fast=16, beta_slow=2, original_max_position_embeddings=8192))),
    "original-from-max-position": (transformers.LlamaConfig, _yarn(dict(factor=8.0))),
    "original-at-top-level": (transformers.LlamaConfig, _yarn(
        dict(factor=4.0, original_max_position_embeddings=8192), original_max_position_embeddings=2048)),
    "zero-width-ramp": (transformers.LlamaConfig, _yarn(dict(factor=2.0, original_max_position_embeddings=4))),
    "partial-rotary": (transformers.LlamaConfig, _yarn(dict(
        factor=4.0, partial_rotary_factor=0.5, original_max_position_embeddings=4096))),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_yarn_frequencies_and_attention_factor_match_transformers(name):
    config_cls, hf = CONFIGS[name]
    hf_config = config_cls(**copy.deepcopy(hf))
    expected_inv_freq, expected_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_config)
    theta, scaling = rope_fields(hf)
    rope = hf.get("rope_parameters") or {}
    head_dim = getattr(hf_config, "head_dim", hf_config.hidden_size // hf_config.num_attention_heads)
    dims = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    inv_freq = rope_inv_freq(dims, theta, scaling)
    assert scaling.rope_type == "yarn" and inv_freq.dtype == np.float32
    # numpy's and torch's float32 powers of theta differ in the last bit for some dims (every rope type's),
    # 1 / power makes that up to 2 ulps; YaRN's own operations follow transformers' order and add nothing.
    np.testing.assert_allclose(inv_freq, expected_inv_freq.numpy(), rtol=2**-22, atol=0)
    assert attention_factor(scaling) == expected_factor


def test_yarn_reads_transformers_defaults():
    _, scaling = rope_fields(_yarn(dict(factor=4, beta_fast=None, truncate=None)))
    assert (scaling.factor, scaling.original_max_position_embeddings) == (4.0, 131072)
    assert (scaling.beta_fast, scaling.beta_slow, scaling.truncate) == (32.0, 1.0, False)  # null truncate: false
    _, scaling = rope_fields(QWEN25)
    assert (scaling.beta_fast, scaling.beta_slow, scaling.truncate, scaling.mscale) == (32.0, 1.0, True, None)


def test_qwen2_with_yarn_matches_hf(tmp_path):
    """Frequency pairs 0-2 of 8 ramp from kept to slowed by 4 (the rest slowed), cos and sin scaled by 1 + 0.1 ln 4."""
    rope = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64)
    path = save_hf_model("qwen2", tmp_path, rope_parameters=rope)
    hf_model = make_hf_model("qwen2", rope_parameters=rope)
    prompt = np.random.RandomState(0).randint(3, 256, size=48).tolist()
    with torch.no_grad():
        expected = hf_model(torch.tensor([prompt])).logits[0].numpy()
        hf_tokens = hf_model.generate(torch.tensor([prompt[:12]]), max_new_tokens=24, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)[0, 12:].tolist()
    llm = LLM(path, dtype="float32", max_seq_len=128, cpu_kernels=False)
    assert llm.config.rope_scaling.rope_type == "yarn"
    got = llm.logits(prompt)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    out = llm.generate([prompt[:12]], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
    assert out.token_ids == hf_tokens
