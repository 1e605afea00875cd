"""Prompt lookup on the device (`method="ngram_device"`): the host's lookup rule, greedy identical
to plain decoding with several verify rounds a call, under preemption and prefix caching, and
no compiles after warm-up. (The sampled distribution is tested in test_speculative_sampling.)"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from engine_knobs import ENGINE
from engine_runs import traces_after_warmup

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.engine.ngram_lookup import ngram_draft
from jaxinfer.runtime.ngram_rider import NgramLookup, latest_match

K = 3
LOOP = [21, 22, 23, 24, 25, 26] * 4
PROMPTS = [LOOP, LOOP[:9] + [40, 41] + LOOP[:9], *[np.random.RandomState(i).randint(3, 250, size=n).tolist()
                                                  for i, n in enumerate([5, 30])]]
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(checkpoint_dir):
    return checkpoint_dir("llama3")


def make(model, **spec) -> LLM:
    config = None if spec.pop("plain", False) else SpeculativeConfig(
        method="ngram_device", num_speculative_tokens=K, **spec)
    return LLM(model, speculative=config, **ENGINE)


@pytest.fixture(scope="module")
def plain(model):
    return make(model, plain=True)


def token_ids(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [out.token_ids for out in llm.generate(prompts, params)]


def device_draft(ids: np.ndarray, k: int, lookup: NgramLookup, width: int = 48) -> list[int]:
    """What the device's lookup drafts for one row whose tokens are ids (at most k)."""
    history = np.zeros((1, width), np.int32)
    history[0, : len(ids)] = ids
    last = jnp.asarray([len(ids) - 1], jnp.int32)
    end = int(latest_match(jnp.asarray(history), last, jnp.asarray([k], jnp.int32), lookup)[0])
    found = 0 if end < 0 else min(k, len(ids) - 1 - end)
    return history[0, end + 1 : end + 1 + found].tolist()


def test_the_device_lookup_drafts_what_the_host_lookup_does():
    rng = np.random.default_rng(0)
    lookup = NgramLookup(1, 3)
    for _ in range(60):  # a small vocabulary: repeats of every length, matches near the end and none
        ids = rng.integers(0, int(rng.integers(2, 9)), size=int(rng.integers(1, 40))).astype(np.int32)
        k = int(rng.integers(1, 6))
        assert device_draft(ids, k, lookup) == ngram_draft(ids, k, 1, 3).tolist(), (ids.tolist(), k)


def test_greedy_equals_plain_with_several_rounds_a_call(model, plain):
    llm = make(model, adaptive=False)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == token_ids(plain, PROMPTS)
    metrics = llm.metrics()
    assert metrics["accepted"] > 0 and metrics["spec_passes"] > 0
    assert llm.engine.runner.spec_rounds > 1  # rounds a call drafts on the device, as a draft model's
    # Fewer target passes than tokens: the loops' drafts were found and accepted.
    assert metrics["tokens_per_target_pass"] > 1.2, metrics


def test_preemption_and_prefix_caching_keep_outputs(model, plain):
    """Four long loops do not fit the 15-page pool together: requests are preempted mid-speculation
    and recompute (the token pool with them); the last prompt's first page is a prefix-cache hit,
    whose tokens the lookup reads from the pool as its first writer stored them."""
    llm = make(model, adaptive=False)
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    prompts = [LOOP, LOOP[1:], LOOP[2:], LOOP + PROMPTS[3][:6]]
    assert token_ids(llm, prompts, params) == token_ids(plain, prompts, params)
    assert llm.metrics()["num_preemptions"] > 0 and llm.metrics()["prefix_cache_hits"] > 0


def test_no_compiles_after_warmup(model):
    llm = make(model, adaptive=False)
    # Long enough for the greedy loop to draft behind the calls its first tokens take (they break the loop).
    count, traces = traces_after_warmup(llm, PROMPTS, greedy_tokens=24)
    assert llm.metrics()["spec_decode_num_drafts"] > 0
    assert count > 4 and traces == []


def test_a_fixed_token_filter_keeps_several_rounds_a_call(model, plain):
    """allowed_token_ids give every drafted position of every round the same mask, so a filtered row
    still verifies several rounds a call (a mask per token, as a grammar's, would hold one round)."""
    llm = make(model, adaptive=False)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, allowed_token_ids=sorted({*LOOP, 40, 41}))
    before = llm.metrics()
    tokens = token_ids(llm, [LOOP], params)
    after = llm.metrics()
    assert tokens == token_ids(plain, [LOOP], params) and set(tokens[0]) <= {*LOOP, 40, 41}
    passes, calls = (after[k] - before[k] for k in ("spec_passes", "engine_steps"))
    assert after["accepted"] > before["accepted"] and passes > calls, (passes, calls)
