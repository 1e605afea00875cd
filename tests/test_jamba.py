"""JambaForCausalLM: two requests decoding together through the engine (Mamba-1 states in the row-slot pools, K/V
of the attention layer in the pages) give each transformers' greedy tokens for it alone; the layer schedule read
from the periods and offsets, and what it cannot be (and what the state layers run without), refused by name.
(Its float32 logits against transformers: test_hf_parity's "jamba".)"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import torch
from hf_models import make_hf_model

from jaxinfer import LLM, ConfigError, SamplingParams, SpeculativeConfig
from jaxinfer.entrypoints.state_settings import check_speculation, prefix_caching_setting
from jaxinfer.models.jamba import read_config

PROMPT = np.random.RandomState(0).randint(3, 256, size=40).tolist()
PROMPTS = [PROMPT[:5], PROMPT[3:22]]  # 5 and 19 tokens: the 19 prefills over two 16-token steps
# The 5 samples its first token a step before the 19 does: one more token for it ends both in the same step, so the
# engine compiles no one-row decode program (~1.3 s of this test's ~5.5).
GREEDY = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (17, 16)]
# Attention as this platform runs it where the pools say "gpu" (below): a CPU's reference, not the Triton kernel.
ATTENTION = "reference" if jax.default_backend() == "cpu" else "auto"
# Jamba-v0.1's schedule (JambaConfig's defaults): attention at 4, 12, ..., experts on the odd layers.
V0_1 = dict(vocab_size=65536, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
            num_key_value_heads=8)


def hf_picks(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> list[int]:
    """transformers' greedy pick after the prompt and after each prefix of `tokens`, from one forward pass: equal to
    `tokens` exactly when they are its greedy continuation (each pick the argmax given the ones before)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:]
    return logits.argmax(-1).tolist()


def on_accelerator_rule(llm: LLM, chunk_size: int) -> LLM:
    """llm's step programs picking the Mamba layers' recurrence as a GPU's do (mamba2_mixer.chunked_form): pools
    marked "gpu" and Mamba-1's chunk_size (256 from every checkpoint) set to `chunk_size`, so that a step of that
    many tokens or more takes the chunked selective scan (models/selective_chunks), a smaller one the token scan."""
    runner = llm.engine.runner
    runner.pages = dataclasses.replace(runner.pages, platform="gpu")
    ss = dataclasses.replace(runner.model_config.state_space, chunk_size=chunk_size)
    runner.model_config = dataclasses.replace(runner.model_config, state_space=ss)
    return llm


def test_two_requests_decoding_together_match_hf_each_alone(checkpoint_dir):
    """5 and 19 tokens in one batch of 16-token steps: the 19 prefills in two chunks (its Mamba states continue
    across them) beside the other's first decode steps, then both decode together, each from its own slot: each
    gets transformers' greedy tokens for it alone (checked by teacher forcing: a generate() of the same tokens
    cost ~10 s on the reference's Python scan). The 16-token steps run the accelerators' chunked selective scan
    (chunks of 8: requests' segments within and across them), the decode steps the token scan."""
    llm = LLM(checkpoint_dir("jamba"), dtype="float32", max_seq_len=64, max_num_seqs=2, max_num_batched_tokens=16,
              cpu_kernels=False, attention_backend=ATTENTION)
    on_accelerator_rule(llm, chunk_size=8)
    model = make_hf_model("jamba")
    outs = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert [hf_picks(model, p, out) for p, out in zip(PROMPTS, outs)] == outs


def test_layer_schedule_follows_the_periods_and_offsets():
    cfg = read_config(V0_1, "JambaForCausalLM")
    attention = [i for i in range(32) if not cfg.is_state_layer(i)]
    assert attention == [4, 12, 20, 28]
    assert [i for i in range(32) if cfg.is_moe_layer(i)] == list(range(1, 32, 2))
    assert cfg.num_experts == 16 and cfg.experts_per_token == 2 and not cfg.norm_topk_prob
    assert cfg.nope_layers == tuple(range(32))  # no rotary anywhere
    ss = cfg.state_space
    assert (ss.conv_dim, ss.state_size, ss.time_step_rank, ss.bcdt_norm) == (8192, 16, 256, True)
    dense = read_config({**V0_1, "num_experts": 1}, "JambaForCausalLM")  # one expert: transformers' MLP everywhere
    assert not any(dense.is_moe_layer(i) for i in range(32))


@pytest.mark.parametrize("override, message", [
    (dict(attn_layer_offset=8), "attn_layer_period 8 and attn_layer_offset 8 are not supported"),
    (dict(expert_layer_period=0), "expert_layer_period 0 and expert_layer_offset 1 are not supported"),
    (dict(mamba_dt_rank=0), "mamba_dt_rank 0 is not supported"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported for JambaForCausalLM"),
])
def test_unsupported_schedules_are_refused_by_name(override, message):
    with pytest.raises(ConfigError, match=message):
        read_config({**V0_1, **override}, "JambaForCausalLM")


def test_prefix_caching_and_speculation_are_refused_by_name():
    """As for every model with state layers: a cached page holds K/V, not the Mamba state after it."""
    cfg = read_config(V0_1, "JambaForCausalLM")
    assert prefix_caching_setting(None, cfg) is False
    with pytest.raises(ConfigError, match="enable_prefix_caching=True is not supported for JambaForCausalLM"):
        prefix_caching_setting(True, cfg)
    with pytest.raises(ConfigError, match="speculative decoding .* not supported for JambaForCausalLM"):
        check_speculation(SpeculativeConfig(method="ngram", num_speculative_tokens=2), cfg)
