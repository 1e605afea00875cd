"""GraniteMoeHybridForCausalLM (Granite 4.0-H): Mamba2 and attention layers in one model, against transformers
on the same tiny saved weights: logits, and a batched, chunked and preempted engine run (state pools for the
Mamba2 layers, pages for the attention layer) giving each prompt transformers' greedy tokens for it alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from hf_versions import skip_ungrouped_gated_norm

from jaxinfer import LLM, SamplingParams

# Mamba2, attention (NoPE, as Granite 4.0 ships), Mamba2; 4 experts (2 a token) beside a 64-wide shared MLP;
# Granite's multipliers away from 1.
CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, shared_intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
              layer_types=["mamba", "attention", "mamba"], mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2,
              mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, embedding_multiplier=2.0,
              residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=0.5, initializer_range=0.1,
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
PROMPT = np.random.RandomState(1).randint(3, 256, size=40).tolist()
PROMPTS = [PROMPT[:6], PROMPT[2:30], PROMPT[:13]]  # 6, 28 and 13 tokens
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def hf_model() -> torch.nn.Module:
    """A random float32 GraniteMoeHybridForCausalLM (1-d parameters moved off their init values)."""
    torch.manual_seed(0)
    model = transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(**CONFIG)).eval()
    skip_ungrouped_gated_norm(model)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(0.1 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def llm(hf_model, tmp_path_factory) -> LLM:
    """The model saved and loaded in float32: 16 tokens a step (the 28-token prompt prefills in two chunks) and 4
    pages of 16 for 2 requests at a time of up to 44 tokens (some are preempted)."""
    path = tmp_path_factory.mktemp("granite_moe_hybrid")
    hf_model.save_pretrained(path)
    return LLM(str(path), dtype="float32", max_seq_len=64, max_num_seqs=2, max_num_batched_tokens=16, num_pages=5,
               cpu_kernels=False)


def hf_greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    """transformers' 16 greedy tokens for the prompt alone."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_logits_match_hf(hf_model, llm):
    with torch.no_grad():
        expected = hf_model(torch.tensor([PROMPT])).logits[0].numpy()
    got = llm.logits(PROMPT)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_batch_chunked_and_preempted_matches_each_prompt_alone_in_hf(hf_model, llm):
    """And again in reverse order, each request starting afresh in a slot another left its state in."""
    expected = [hf_greedy(hf_model, p) for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
    assert llm.metrics()["num_preemptions"] > 0
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[::-1], GREEDY)] == expected[::-1]
    assert llm.engine.config.enable_prefix_caching is False
