"""A Gemma 4 assistant (Gemma4AssistantForCausalLM) drafting inside the engine, method "mtp" with a draft_model as
vLLM runs it: greedy tokens identical to plain decoding with drafts accepted and rejected, through chunked prefill
and a prefix cache hit, and sampled tokens keeping the target's distribution."""

from __future__ import annotations

import collections
import dataclasses

import jax
import numpy as np
import pytest
import torch
from engine_runs import engine_ids
from gemma4_assistants import following_assistant
from hf_models import make_hf_model
from scipy import stats

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.sampling.sampler import processed_logprobs, sampling_arrays

# Prompts whose greedy continuations hold six different tokens each (the tiny target repeats a token a few times,
# then moves on): a draft that ignores the token it reads is mostly rejected.
PROMPTS = [np.random.RandomState(seed).randint(3, 256, size=24).tolist() for seed in (1, 11)]
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=3, temperature=0.9, top_k=8, top_p=0.9, ignore_eos=True)
ROWS = 128
PREFIXES = 64  # of the paths to token 3 at most: top_k 8 at each of two tokens
# Prefill chunks of 16 tokens: each prompt takes two steps (chunked prefill), its second chunk and the second
# prompt's first in one.
KNOBS = dict(dtype="float32", max_seq_len=64, max_num_seqs=1, max_num_batched_tokens=16, enable_prefix_caching=True)


@pytest.fixture(scope="module")
def pair(checkpoint_dir, tmp_path_factory) -> tuple:
    """(the target's checkpoint, an assistant drafting its greedy continuations' next tokens, HF's greedy tokens,
    the HF target)."""
    target = make_hf_model("gemma4_dense")
    with torch.no_grad():
        expected = [target.generate(torch.tensor([p]), max_new_tokens=GREEDY.max_tokens, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
    pairs = collections.Counter((a, b) for out in expected for a, b in zip(out, out[1:]))
    follows = {a: b for (a, b), _ in sorted(pairs.items(), key=lambda item: item[1])}  # each token's likeliest next
    path = tmp_path_factory.mktemp("gemma4_assistant")
    following_assistant(target, follows).save_pretrained(path)
    return checkpoint_dir("gemma4_dense"), path, expected, target


@pytest.fixture(scope="module")
def llm(pair) -> LLM:
    """The target drafting with the assistant, k = 3 every step (one engine for both tests: one set of programs)."""
    target, assistant = pair[:2]
    spec = SpeculativeConfig(method="mtp", draft_model=str(assistant), num_speculative_tokens=3, adaptive=False,
                             fallback=False)
    return LLM(target, speculative=spec, **KNOBS)


def test_greedy_with_assistant_drafts_equals_plain(llm, pair):
    """Greedy tokens with the assistant's drafts are plain decoding's (HF's), twice: the second call's prompts hit
    the prefix cache; the prompts are prefilled in chunks; drafts are mostly accepted (where the continuation
    follows the map) and rejected where it moves on."""
    for _ in range(2):
        assert engine_ids(llm, PROMPTS, GREEDY) == pair[2]
    metrics = llm.metrics()
    print(f"acceptance {metrics['acceptance_rate']:.2f} of {metrics['drafted']} drafted")
    assert metrics["method"] == "mtp" and 0.5 < metrics["acceptance_rate"] < 1
    assert metrics["prefix_cache_hits"] > 0


def exact_marginals(target: torch.nn.Module, prompt: list[int], depth: int) -> np.ndarray:
    """Exact marginals [depth - 1, V] of generated tokens 2 .. depth under the target's processed distribution
    (every path through the tokens it can sample; HF's logits on the same weights, jaxinfer's processing)."""
    paths, marginals = {(): 1.0}, []
    for level in range(depth):
        prefixes = list(paths)
        with torch.no_grad():
            logits = target(torch.tensor([prompt + list(x) for x in prefixes])).logits[:, -1].numpy()
        padded = np.zeros((PREFIXES, logits.shape[1]), np.float32)  # one shape: one program
        padded[: len(prefixes)] = logits
        probs = np.exp(np.asarray(PROCESSED(padded), np.float64))[: len(prefixes)]
        weights = np.asarray([paths[x] for x in prefixes])
        if level:
            marginals.append(weights @ probs)
        paths = {x + (int(t),): paths[x] * probs[i, t]
                 for i, x in enumerate(prefixes) for t in np.flatnonzero(probs[i])}
    return np.stack(marginals)


@jax.jit
def PROCESSED(logits: jax.Array) -> jax.Array:  # noqa: N802 - a constant program
    """SAMPLED's processed log-probabilities [PREFIXES, V] of raw logits (what the engine samples from)."""
    return processed_logprobs(logits, sampling_arrays([SAMPLED] * PREFIXES, [0] * PREFIXES))


def fit_pvalue(tokens: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit; tokens outside the support fail outright, bins expecting < 5 are pooled."""
    counts = np.bincount(tokens, minlength=len(probs))
    if np.any(counts[probs == 0]):
        return 0.0
    expected = probs * len(tokens)
    big = expected >= 5
    observed, expected = np.append(counts[big], counts[~big].sum()), np.append(expected[big], expected[~big].sum())
    keep = expected > 0
    return stats.chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue


def test_sampling_with_assistant_drafts_keeps_the_target_distribution(llm, pair):
    """ROWS seeds of one prompt (temperature, top-k, top-p): generated tokens 2 and 3, which the first verify round
    drafted, follow the exact marginals of the target's processed distribution (test_speculative_sampling's
    check, at fewer rows)."""
    prompt, drafted = PROMPTS[1], llm.metrics()["drafted"]
    outs = llm.generate([prompt] * ROWS, [dataclasses.replace(SAMPLED, seed=seed) for seed in range(ROWS)])
    tokens = np.asarray([o.token_ids for o in outs])
    assert llm.metrics()["drafted"] > drafted
    exact = exact_marginals(pair[3], prompt, 3)
    for position in (1, 2):
        assert fit_pvalue(tokens[:, position], exact[position - 1]) > 1e-3
