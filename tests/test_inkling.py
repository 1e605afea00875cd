"""Inkling (models/inkling) against transformers on the same tiny saved weights: the whole-sequence pass's float32
logits (its contiguous cache, the convs from zeros) and the engine's greedy tokens (the relative-bias attention over
each token's gathered pages, the four convs' states carried across a prefill chunk and the decode steps), off one
LLM; how its config is read and what is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_models import make_hf_model, save_hf_model

from jaxinfer import LLM, ConfigError, SamplingParams, from_hf_config

PROMPT = np.random.RandomState(2).randint(3, 256, size=40).tolist()
TINY = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=7, num_attention_heads=16,
            architectures=["InklingForCausalLM"])


@pytest.fixture(scope="module")
def hf_model() -> torch.nn.Module:
    return make_hf_model("inkling")


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    """16 tokens a step: the 20-token prompt prefills over two steps."""
    path = save_hf_model("inkling", tmp_path_factory.mktemp("inkling"))
    return LLM(str(path), dtype="float32", max_seq_len=32, max_num_seqs=1, max_num_batched_tokens=16,
               cpu_kernels=False)


def test_logits_match_hf(hf_model, llm):
    """Float32 rounding only, past both layers' bias extents and the log-scaling floor."""
    with torch.no_grad():
        expected = hf_model(torch.tensor([PROMPT[:32]])).logits[0].numpy()
    got = llm.logits(PROMPT[:32])
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_engine_decode_matches_hf(hf_model, llm):
    """8 greedy tokens after a prompt prefilled in two chunks (the convs' states and the pages carried over): each
    transformers' argmax, with its log-probability (past the log-scaling floor: tau bites)."""
    prompt = PROMPT[:20]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=1)
    out = llm.generate([prompt], params)[0].outputs[0]
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + out.token_ids])).logits[0]
    expected = torch.log_softmax(logits, -1).numpy()[len(prompt) - 1 : -1]
    got = [step[t].logprob for step, t in zip(out.logprobs, out.token_ids)]
    assert out.token_ids == expected.argmax(-1).tolist()
    np.testing.assert_allclose(got, expected[np.arange(8), out.token_ids], atol=1e-4)
    assert llm.engine.config.enable_prefix_caching is False


def test_config_as_transformers_reads_it():
    """Sliding layers but every sixth (their own K/V heads), layer kinds' bias extents, sparse MLPs by default."""
    cfg = from_hf_config(TINY)
    assert cfg.layer_windows == (512,) * 5 + (0, 512)
    assert cfg.layer_kv_heads == (16,) * 5 + (8, 16) and cfg.dense_layers == ()
    assert (cfg.inkling.d_rel, cfg.inkling.rel_extent, cfg.inkling.shared_experts) == (16, 1024, 2)
    assert (cfg.logits_scaling, cfg.routed_scaling_factor, cfg.tie_word_embeddings) == (24.0, 8.0, False)
    assert cfg.state_space.layers == tuple(range(7)) and cfg.keeps_kv(3)
    legacy = from_hf_config({**TINY, "dense_mlp_idx": 2, "dense_intermediate_size": 96})
    assert legacy.dense_layers == (0, 1) and (legacy.intermediate_size, legacy.moe_intermediate_size) == (96, 8)


@pytest.mark.parametrize("fields,message", [
    (dict(swa_num_attention_heads=8), "swa_num_attention_heads 8 is not supported for InklingForCausalLM"),
    (dict(unpadded_vocab_size=6), "unpadded_vocab_size 6 is not supported"),
    (dict(layer_types=["hybrid", "chunked"] * 3 + ["hybrid"]), "layer_types .* must give one of"),
    (dict(mlp_layer_types=["dense", "moe"] * 3 + ["dense"]), "mlp_layer_types .* must give one of"),
    (dict(num_experts_per_tok=300), "num_experts_per_tok 300 must be in \\[1, n_routed_experts \\(256\\)\\]"),
    (dict(conv_kernel_size=1), "conv_kernel_size 1 >= 2"),
])
def test_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**TINY, **fields})
