"""Prompt-lookup speculation inside the engine: greedy identical to plain decoding under every
scheduling choice, the lookup's choice of match, the switch-off, and no compiles
after warm-up. (The sampled distribution is tested in test_speculative_sampling.)"""

from __future__ import annotations

import numpy as np
import pytest
from engine_knobs import ENGINE
from engine_runs import traces_after_warmup

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.engine.ngram_lookup import ngram_draft

K = 3
# Repetitive prompts (prompt lookup finds runs to copy) next to random ones (it finds little).
LOOP = [21, 22, 23, 24, 25, 26] * 4
PROMPTS = [LOOP, LOOP[:9] + [40, 41] + LOOP[:9], *[np.random.RandomState(i).randint(3, 250, size=n).tolist()
                                                  for i, n in enumerate([5, 30])]]
GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(checkpoint_dir):
    return checkpoint_dir("llama3")


def make(model, spec: dict | None = None) -> LLM:
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=K, **spec) if spec is not None else None
    return LLM(model, speculative=config, **ENGINE)


@pytest.fixture(scope="module")
def plain(model):
    return make(model)


@pytest.fixture(scope="module")
def spec_llm(model):
    """Set up as a vLLM user writes it (vLLM's name and dict; `speculative.vllm_config`)."""
    llm = LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": K, "adaptive": False}, **ENGINE)
    assert llm.speculative_config == SpeculativeConfig(method="ngram", num_speculative_tokens=K, adaptive=False)
    return llm


def token_ids(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [out.token_ids for out in llm.generate(prompts, params)]


def test_ngram_lookup_prefers_the_longest_latest_full_match():
    seq = np.asarray([7, 1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3], np.int32)
    assert ngram_draft(seq, 3, 1, 3).tolist() == [4, 5, 6]  # "1 2 3" seen twice: the latest with 3 after it
    assert ngram_draft(seq[:-1], 3, 1, 3).tolist() == [3, 4, 5]  # "1 2" too; "8 1 2" not seen before
    assert ngram_draft(np.full(6, 5, np.int32), 3, 1, 3).tolist() == [5, 5, 5]  # a period-1 loop still gives k
    assert ngram_draft(np.asarray([1, 2, 1, 2], np.int32), 3, 1, 3).tolist() == [1, 2]  # no full match: the latest
    assert ngram_draft(np.asarray([1, 2, 3, 4], np.int32), 3, 1, 3).tolist() == []  # nothing repeats


def test_greedy_equals_plain_and_drafts_are_accepted(plain, spec_llm):
    before = spec_llm.metrics()
    outs = spec_llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == token_ids(plain, PROMPTS)
    after = spec_llm.metrics()
    assert after["spec_decode_num_draft_tokens"] > before["spec_decode_num_draft_tokens"]
    assert after["accepted"] > before["accepted"]
    assert all(o.spec_stats is not None for o in outs)


def test_mixed_sampling_features_keep_outputs(plain, spec_llm):
    """Stops inside accepted runs, min_tokens, penalties and logprobs rows next to drafting rows."""
    free = token_ids(plain, [LOOP])[0]
    params = [
        SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[free[5]]),
        SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[free[2]], min_tokens=4, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0, logprobs=2, ignore_eos=True),
    ]
    prompts = [LOOP, LOOP, PROMPTS[1], PROMPTS[2]]
    expected = plain.generate(prompts, params)
    got = spec_llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert [o.finish_reason for o in got] == [o.finish_reason for o in expected]
    assert got[3].outputs[0].logprobs is not None and len(got[3].outputs[0].logprobs) == 12


def test_logprobs_rows_draft_and_match_plain(plain, spec_llm):
    """A row asking logprobs speculates (it no longer keeps the batch plain), and every token's
    logprob, rank and top entries are those plain decoding reports for it."""
    params = SamplingParams(max_tokens=16, temperature=0, logprobs=3, ignore_eos=True)
    prompts = [LOOP, PROMPTS[1]]
    expected = plain.generate(prompts, params)
    before = spec_llm.metrics()
    got = spec_llm.generate(prompts, params)
    assert spec_llm.metrics()["accepted"] > before["accepted"]
    for mine, theirs in zip(got, expected):
        assert mine.token_ids == theirs.token_ids
        mine_lp, theirs_lp = mine.outputs[0].logprobs, theirs.outputs[0].logprobs
        assert len(mine_lp) == len(theirs_lp) == 16
        for token, a, b in zip(mine.token_ids, mine_lp, theirs_lp):
            assert list(a) == list(b) and a[token].rank == b[token].rank == 1
            np.testing.assert_allclose([float(v) for v in a.values()], [float(v) for v in b.values()], atol=1e-4)


def test_logit_bias_holds_in_verify_steps(plain, spec_llm):
    """A bias that bans a token the loop repeats: drafts holding it are rejected, outputs equal plain decoding's."""
    free = token_ids(plain, [LOOP])[0]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logit_bias={free[1]: -100, free[4]: 4.0})
    drafted = spec_llm.metrics()["spec_decode_num_draft_tokens"]
    got = token_ids(spec_llm, [LOOP, LOOP[3:]], params)
    assert got == token_ids(plain, [LOOP, LOOP[3:]], params) and free[1] not in got[0]
    assert spec_llm.metrics()["spec_decode_num_draft_tokens"] > drafted


def test_max_tokens_never_exceeded(spec_llm):
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (1, 2, 3, 5)]
    outs = spec_llm.generate([LOOP] * len(params), params)
    assert [len(o.token_ids) for o in outs] == [1, 2, 3, 5]


def test_preemption_and_prefix_caching_keep_outputs(model, plain):
    """Four long loops do not fit the 15-page pool together: requests are preempted mid-speculation.
    The last prompt starts with the first's full page, a prefix-cache hit once admitted."""
    llm = make(model, dict(adaptive=False))
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    prompts = [LOOP, LOOP[1:], LOOP[2:], LOOP + PROMPTS[3][:6]]
    assert token_ids(llm, prompts, params) == token_ids(plain, prompts, params)
    assert llm.metrics()["num_preemptions"] > 0 and llm.metrics()["prefix_cache_hits"] > 0


def test_adaptive_switch_off_when_verification_saturates(model, plain):
    """Every verified token costs a full step (saturation at 1 token): drafting never pays."""
    llm = make(model, dict(verify_saturation_tokens=1))
    assert token_ids(llm, PROMPTS) == token_ids(plain, PROMPTS)
    assert llm.metrics()["spec_decode_num_drafts"] == 0


def test_no_compiles_after_warmup(model):
    llm = make(model, dict(adaptive=False))
    count, traces = traces_after_warmup(llm, PROMPTS)
    assert llm.metrics()["spec_decode_num_drafts"] > 0
    assert count > 4 and traces == []
