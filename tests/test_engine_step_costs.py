"""The engine's measured step costs and the speculation plan that uses them: a verify step that
costs more than its accepted tokens save switches prompt lookup off (with a measuring step now
and then), a cheap one keeps it on, and the outputs equal plain decoding either way."""

from __future__ import annotations

import numpy as np
import pytest
from engine_knobs import ENGINE

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.engine import speculation
from jaxinfer.engine.request import Request
from jaxinfer.engine.speculation import EngineDraft, Speculator
from jaxinfer.engine.step_costs import StepCosts, spread_host_share
from jaxinfer.runtime.host_step import CATCH_UP_SPAN

K = 3
LOOP = [21, 22, 23, 24, 25, 26] * 4  # prompt lookup drafts it all, every draft accepted
REPROBE = 32  # the tests' reprobe period (decode steps), shorter than the engine's
# Two reprobe periods and more, as long as the shared max_seq_len lets LOOP run.
GREEDY = SamplingParams(max_tokens=ENGINE["max_seq_len"] - len(LOOP), temperature=0, ignore_eos=True)


def test_costs_need_both_kinds_and_drop_each_first_time():
    costs = StepCosts(draft_cost=0.25)
    costs.record_plain(4, 9.0, steps=3)  # the first of each kind may be a compile: dropped
    costs.record_verify(4, 50.0, draft_steps=2)
    assert costs.cost_model(4) is None and not costs.needs_plain(4)
    costs.record_verify(4, 0.012, draft_steps=2)
    assert costs.needs_plain(4) and costs.cost_model(4) is None
    for seconds in (0.008, 0.006, 0.010):  # 4 steps each: the fastest is 1.5 ms a step
        costs.record_plain(4, seconds, steps=4)
    model = costs.cost_model(4)
    # 12 ms over 1.5 ms is 8 plain steps, less the 2 draft steps at 0.25.
    np.testing.assert_allclose(model.round_base, [7.5, 7.5])
    np.testing.assert_allclose(model.per_draft, [0.25, 0.25])
    assert float(model.verify_per_row) == 0.0
    assert costs.cost_model(8) is None  # per row bucket


def test_rounds_are_priced_from_calls_that_ran_every_round():
    """A one-round measuring call pays the call's fixed cost in its one round (1.8-2.9x a round of a
    whole call at batch 1 on the CPU, demo draft and head): once two whole calls are timed, only
    they price a round; until then the first calls run whole."""
    costs = StepCosts(draft_cost=0.0)
    for seconds in (0.009, 0.004, 0.004):
        costs.record_plain(1, seconds, steps=4)  # 1 ms a step
    assert costs.needs_whole(1) and not costs.has_probe(1)
    costs.record_verify(1, 0.005, draft_steps=0)  # one-round calls: 5 ms a round
    costs.record_verify(1, 0.005, draft_steps=0)
    assert float(costs.cost_model(1).round_base[0]) == 5.0
    costs.record_verify(1, 0.030, draft_steps=0, whole=True)  # the first whole call may compile
    costs.record_verify(1, 0.002, draft_steps=0, whole=True)
    assert not costs.needs_whole(1) and float(costs.cost_model(1).round_base[0]) == 2.0


def test_a_short_call_pays_its_host_share_as_a_full_call_would():
    # 10 ms of device and 4 ms of host for one round of the four a full call runs: 1 ms of host.
    assert spread_host_share(0.014, 0.010, ran=1, planned=4) == pytest.approx(0.011)
    assert spread_host_share(0.014, 0.010, ran=4, planned=4) == pytest.approx(0.014)


def test_a_verify_never_counts_as_cheaper_than_a_plain_step():
    costs = StepCosts(draft_cost=1.0)
    for _ in range(2):
        costs.record_plain(1, 0.004, steps=4)
        costs.record_verify(1, 0.002, draft_steps=3)
    assert float(costs.cost_model(1).round_base[0]) == 1.0


def plain_steps_until_drafting(produce) -> int:
    """Plain steps a request with an unlucky first verify step (nothing accepted) decodes before the
    plan drafts again, when verify steps cost 3 plain steps; `produce(draft)` is each plain
    step's output, scored against the draft the plan declined."""
    speculator = Speculator(SpeculativeConfig(method="ngram", num_speculative_tokens=K))
    for _ in range(2):
        speculator.measured.record_plain(1, 0.004, steps=4)
        speculator.measured.record_verify(1, 0.003, draft_steps=0)
    request = Request("r", 0, None, LOOP, GREEDY, seed=0, stop_ids=())
    request.spec_acceptance = 0.0
    steps = 0
    while speculator.plan([request], rows=1) is None:
        draft = speculator.declined[id(request)]
        speculator.observe_plain([(request, produce(draft))])
        speculator.count_plain(1, 1)
        steps += 1
    return steps


def test_a_new_request_counts_on_the_acceptance_the_pair_has_had():
    """Unmeasured, a request counts on full acceptance until any row is measured; then on the
    rows' moving average: after drafts that kept failing, a new request starts plain rather than
    paying a measuring verify step (with a draft model, also the draft's read of its prompt)."""
    speculator = Speculator(SpeculativeConfig(method="ngram", num_speculative_tokens=K))
    for _ in range(2):  # a verify step costs 3 plain steps
        speculator.measured.record_plain(1, 0.004, steps=4)
        speculator.measured.record_verify(1, 0.003, draft_steps=0)
    fresh = lambda name: Request(name, 0, None, LOOP, GREEDY, seed=0, stop_ids=())  # noqa: E731
    assert speculator.plan([fresh("a")], rows=1) is not None
    old = fresh("old")
    for _ in range(4):
        speculator.observe([old], np.array([K]), np.array([0]))
    assert speculator.plan([fresh("b")], rows=1) is None
    for _ in range(8):
        speculator.observe([old], np.array([K]), np.array([K]))
    assert speculator.plan([fresh("c")], rows=1) is not None


def test_a_dear_measuring_call_waits_until_it_is_a_small_share_of_the_plain_steps():
    costs = StepCosts(draft_cost=0.25)
    for _ in range(2):
        costs.record_plain(64, 0.008, steps=4)  # 2 ms a plain step
    costs.record_probe(64, 0.060)
    assert costs.probe_steps(64) == pytest.approx(30.0) and costs.probe_steps(1) is None
    speculator = Speculator(SpeculativeConfig(method="ngram", num_speculative_tokens=K))
    speculator.measured = costs
    speculator.count_plain(64, REPROBE)
    assert not speculator._reprobing(64, [])
    speculator.count_plain(64, int(30 / speculation.PROBE_SHARE) - REPROBE)
    assert speculator._reprobing(64, [])
    costs.record_probe(64, 0.002 * REPROBE * speculation.PROBE_SHARE / 2)  # cheap: the fixed period
    speculator.plain_run[64] = REPROBE
    assert speculator._reprobing(64, [])


def test_a_row_far_behind_its_draft_catches_up_only_on_a_reprobe():
    """A row decoded plainly for more positions than one call's catch-up reads would cost catch-up
    calls the plan cannot price before it drafts (at a row bucket first met, e.g. a batch's tail,
    each cost a CPU ~30 plain steps): outside a reprobe it stays plain, on one it catches up."""
    speculator = Speculator(SpeculativeConfig(method="draft", draft_model="unused", num_speculative_tokens=K),
                            EngineDraft(cfg=None, weights=None, cost=0.25))
    request = Request("far", 0, None, LOOP, GREEDY, seed=0, stop_ids=())
    request.num_computed = len(LOOP)
    assert speculator.plan([request], rows=1) is not None  # its draft read the prompt: caught up
    request.num_computed += CATCH_UP_SPAN + 1  # decoded plainly past one catch-up's reach
    assert speculator.plan([request], rows=1) is None
    speculator.count_plain(1, REPROBE)
    drafts = speculator.plan([request], rows=1)
    assert [len(d) for d in drafts] == [0] and speculator.measuring  # a one-round catch-up call


@pytest.fixture(autouse=True)
def short_reprobe(monkeypatch):
    monkeypatch.setattr(speculation, "REPROBE_STEPS", REPROBE)


def test_declined_drafts_are_scored_against_the_plain_steps():
    # The plain steps produce what prompt lookup would have drafted: within a few steps the
    # estimate earns a verify step again, long before the reprobe.
    assert 3 <= plain_steps_until_drafting(lambda draft: draft) <= 8
    # They produce something else (the first token differs): only the reprobe drafts again.
    assert plain_steps_until_drafting(lambda draft: draft + 1) == REPROBE


@pytest.fixture(scope="module")
def model(checkpoint_dir):
    return checkpoint_dir("llama3")


@pytest.fixture(scope="module")
def plain_ids(model):
    llm = LLM(model, **ENGINE)
    return llm.generate([LOOP], GREEDY)[0].token_ids


def with_costs(model, monkeypatch, verify_steps: float) -> LLM:
    """An adaptive prompt-lookup engine whose verify step is held at verify_steps plain steps."""
    llm = LLM(model, speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=K), **ENGINE)
    measured = llm.engine.speculator.measured
    for _ in range(3):
        measured.record_plain(1, 0.004, steps=4)
        measured.record_verify(1, 0.001 * verify_steps, draft_steps=0)
    monkeypatch.setattr(measured, "record_plain", lambda *args, **kwargs: None)
    monkeypatch.setattr(measured, "record_verify", lambda *args, **kwargs: None)
    return llm


def test_expensive_verify_steps_switch_prompt_lookup_off(model, plain_ids, monkeypatch):
    """No draft pays for a verify step of 20 plain steps: plain steps run, and after
    REPROBE of them (with something to draft) one measuring step drafts."""
    llm = with_costs(model, monkeypatch, verify_steps=20)
    out = llm.generate([LOOP], GREEDY)[0]
    assert out.token_ids == plain_ids
    assert 1 <= out.spec_stats["spec_passes"] <= len(plain_ids) // REPROBE


def test_cheap_verify_steps_keep_prompt_lookup_on(model, plain_ids, monkeypatch):
    llm = with_costs(model, monkeypatch, verify_steps=1.0)
    out = llm.generate([LOOP], GREEDY)[0]
    assert out.token_ids == plain_ids
    assert out.spec_stats["spec_passes"] >= 10, out.spec_stats


def test_host_drafts_wait_one_chained_call_after_a_plan_declined():
    """With costs that could pay, a host drafter's plan must see the call in flight's tokens, so no
    call is chained behind it; but behind a call whose plan on landed tokens just declined, the
    second in a row or later, one is (the text gave the lookup nothing: half the plain calls then
    overlap the host's work)."""
    speculator = Speculator(SpeculativeConfig(method="ngram", num_speculative_tokens=K, calibrate=False))
    request = Request("r", 0, None, LOOP, GREEDY, seed=0, stop_ids=())
    assert not speculator.declines([request], rows=1)
    speculator.declined_run[1] = 1  # a request's first declined plan: its next call plans on landed tokens
    assert not speculator.declines([request], rows=1, just_declined=True)
    speculator.declined_run[1] = 2
    assert speculator.declines([request], rows=1, just_declined=True)
    speculator.disable("test")
    assert speculator.declines([request], rows=1)
