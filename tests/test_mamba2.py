"""Mamba2ForCausalLM: a tiny saved HF checkpoint against transformers on the same weights, and through the
engine (the per-slot state pool of cache/state_pool): a batched, chunked and preempted run gives each prompt's
greedy tokens as transformers gives them to it alone; what the state layers run without is refused by name."""

from __future__ import annotations

import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hf_versions import skip_ungrouped_gated_norm

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.cache.contiguous import init_cache
from jaxinfer.config.model import ConfigError
from jaxinfer.entrypoints.state_settings import check_offloading, check_speculation, prefix_caching_setting
from jaxinfer.models.mamba2 import mamba_block

# 2 layers, 8 heads of 16 dims in 2 groups, 16 state dims, a 4-wide conv: the mixer's every axis > 1. Chunks of 8:
# where the chunked SSD runs (models/ssd_chunks: the engine's steps below), each 16-token prefill step is two chunks
# with requests' segments inside and across them; decode steps run the scan.
CONFIG = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, state_size=16,
              n_groups=2, conv_kernel=4, expand=2, chunk_size=8, bos_token_id=1, eos_token_id=2, pad_token_id=0)
PROMPT = np.random.RandomState(0).randint(3, 256, size=40).tolist()
PROMPTS = [PROMPT[:5], PROMPT[3:30], PROMPT[:12]]  # 5, 27 and 12 tokens
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def hf_model() -> torch.nn.Module:
    """A random float32 Mamba2ForCausalLM (norms, dt_bias, A_log and D moved off their init values)."""
    torch.manual_seed(0)
    model = transformers.Mamba2ForCausalLM(transformers.Mamba2Config(**CONFIG)).eval()
    skip_ungrouped_gated_norm(model)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(0.1 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def model_dir(hf_model, tmp_path_factory) -> str:
    """The model saved as an HF checkpoint."""
    path = tmp_path_factory.mktemp("mamba2")
    hf_model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def llm(model_dir) -> LLM:
    """The checkpoint loaded in float32 (prefix caching off by default for it): 16 tokens a step, so longer
    prompts prefill in chunks, and 4 pages of 16 tokens for 2 requests at a time of up to 43 tokens, so some
    are preempted (2 rows at most: fewer step programs to compile). Its pools say "gpu", so its step programs take
    the accelerators' form of the recurrence, the chunked SSD, on every prefill step (a CPU's pick the scan)."""
    llm = LLM(model_dir, dtype="float32", max_seq_len=64, max_num_seqs=2, max_num_batched_tokens=16, num_pages=5,
              cpu_kernels=False)
    runner = llm.engine.runner
    runner.pages = dataclasses.replace(runner.pages, platform="gpu")
    return llm


def hf_greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    """transformers' 16 greedy tokens (its recurrent decode path, state carried in its cache)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def token_ids(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]


def test_logits_match_hf(hf_model, llm):
    """Every position's logits of a 40-token prompt (transformers' chunked SSD over chunks of 8, this CPU's scan)."""
    with torch.no_grad():
        expected = hf_model(torch.tensor([PROMPT])).logits[0].numpy()
    got = llm.logits(PROMPT)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_batch_chunked_and_preempted_matches_each_prompt_alone_in_hf(hf_model, llm):
    """Prompts of 5, 27 and 12 tokens in one batch, the 27 prefilled over two steps (the state continues
    across chunks), some preempted and recomputed from a fresh state: each gets transformers' greedy tokens
    for it alone (each slot's state carries its own request). Again in reverse order: each request starts
    afresh in a slot another left its state in."""
    assert llm.config.state_space.chunk_size == 8 < llm.engine.config.max_num_batched_tokens  # the chunked SSD
    assert llm.engine.runner.pages.platform == "gpu"
    expected = [hf_greedy(hf_model, p) for p in PROMPTS]
    assert token_ids(llm, PROMPTS) == expected
    assert llm.metrics()["num_preemptions"] > 0
    assert token_ids(llm, PROMPTS[::-1]) == expected[::-1]


def test_prefix_caching_and_speculation_are_refused_by_name(llm):
    assert prefix_caching_setting(None, llm.config) is False
    assert llm.engine.config.enable_prefix_caching is False
    with pytest.raises(ConfigError, match="enable_prefix_caching=True is not supported for Mamba2ForCausalLM"):
        prefix_caching_setting(True, llm.config)
    with pytest.raises(ConfigError, match="speculative decoding .* not supported for Mamba2ForCausalLM"):
        check_speculation(SpeculativeConfig(method="ngram", num_speculative_tokens=2), llm.config)
    with pytest.raises(ConfigError, match="kv_offloading_size=1.5 is not supported for Mamba2ForCausalLM"):
        check_offloading(1.5, llm.config)
    assert check_offloading(0, llm.config) == 0


def test_bf16_keeps_the_residual_stream_in_float32_as_hf(hf_model, model_dir):
    """residual_in_fp32 (transformers' default): loaded in bfloat16, a layer norms its input rounded to bf16 and
    adds the mixer's output in float32, as transformers' Mamba2Block does: its output is float32 and within 1/64
    of transformers' bf16 block's (the largest about 2); the logits of the 40-token prompt within 2% of the
    largest of transformers' float32 ones."""
    llm16 = LLM(model_dir, dtype="bfloat16", max_seq_len=64, max_num_seqs=2, max_num_batched_tokens=16,
                num_pages=5, cpu_kernels=False)
    stream = hf_model.backbone.embeddings.weight[PROMPT].detach().to(torch.bfloat16)
    with torch.no_grad():
        expected = copy.deepcopy(hf_model.backbone.layers[0]).to(torch.bfloat16)(stream[None])[0].float().numpy()
        expected_logits = hf_model(torch.tensor([PROMPT])).logits[0].numpy()
    lw, cfg, n = llm16.weights.layers[0], llm16.config, len(PROMPT)
    x = jnp.asarray(stream.float().numpy(), jnp.bfloat16)[None]
    layer = jax.jit(mamba_block, static_argnums=(0, 5))  # jitted: eagerly the mixer runs op by op
    got, _ = layer(cfg, x, init_cache(cfg, 1, n, jnp.bfloat16), lw, lw.norm, 0, jnp.arange(n)[None])
    assert got.dtype == jnp.float32
    assert np.abs(np.asarray(got[0]) - expected).max() <= 1 / 64
    logits = llm16.logits(PROMPT)
    assert np.abs(logits - expected_logits).max() <= 0.02 * np.abs(expected_logits).max()
