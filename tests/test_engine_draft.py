"""A draft model speculating inside the engine: greedy identical to plain decoding, and a
self-draft accepting every draft, which holds only if the draft's page pool saw every token the
target's did (prefill chunks, multi-step decode, verify rounds, preemption, shared prefixes)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from engine_knobs import SPECULATION
from engine_runs import engine_ids
from hf_models import save_hf_model
from jax import monitoring

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.engine.request import Request
from jaxinfer.engine.speculation import Speculator
from jaxinfer.runtime.host_step import CATCH_UP_SPAN

K = 3
PROMPTS = [np.random.RandomState(i).randint(3, 250, size=n).tolist() for i, n in enumerate([5, 40, 17, 9])]
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory, checkpoint_dir):
    root = tmp_path_factory.mktemp("engine-draft")
    return {"target": checkpoint_dir("llama2"), "draft": save_hf_model("qwen2", root / "draft", num_hidden_layers=1)}


def make(models, draft: str | None, spec_knobs: dict | None = None) -> LLM:
    spec = None if draft is None else SpeculativeConfig(
        method="draft", draft_model=str(models[draft]), num_speculative_tokens=K, **{"adaptive": False, **(spec_knobs or {})}
    )
    return LLM(models["target"], speculative=spec, **SPECULATION)


@pytest.fixture(scope="module")
def plain(models):
    return engine_ids(make(models, None), PROMPTS, GREEDY)


def test_greedy_equals_plain_with_a_different_draft(models, plain):
    llm = make(models, "draft")
    assert engine_ids(llm, PROMPTS, GREEDY) == plain
    metrics = llm.engine.speculation_metrics()
    assert metrics["drafted"] > 0 and metrics["method"] == "draft"


def test_self_draft_accepts_every_draft(models, plain):
    llm = make(models, "target")
    assert engine_ids(llm, PROMPTS, GREEDY) == plain
    metrics = llm.engine.speculation_metrics()
    assert metrics["drafted"] > 0 and metrics["accepted"] == metrics["drafted"]


def test_preemption_and_shared_prefixes_keep_the_draft_pool_complete(models):
    """A 14-page pool cannot hold four 70-token sequences: requests are preempted and recomputed."""
    prompts = [PROMPTS[1], PROMPTS[1][:32] + [7, 8, 9], PROMPTS[1][:33], PROMPTS[0]]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    expected = engine_ids(make(models, None), prompts, params)
    llm = make(models, "target")
    assert engine_ids(llm, prompts, params) == expected
    metrics, engine = llm.engine.speculation_metrics(), llm.engine.metrics()
    assert engine["num_preemptions"] > 0 and engine["prefix_cache_hits"] > 0
    assert metrics["accepted"] == metrics["drafted"] > 0


def test_verify_rounds_stop_at_the_reserved_pages(models, plain):
    """decode_steps=8 lets one call run 4 verify rounds; with pages reserved for one round only
    (the scheduler's lookahead cut to k+1) the rounds must return to the host before writing past
    a row's pages, else K/V land in the padding page and later tokens differ."""
    llm = make(models, "target")
    scheduler = llm.engine.scheduler
    scheduler.config = dataclasses.replace(scheduler.config, lookahead=K + 1)
    assert engine_ids(llm, PROMPTS, GREEDY) == plain
    metrics = llm.engine.speculation_metrics()
    assert metrics["accepted"] == metrics["drafted"] > 0


def test_draft_catches_up_after_plain_calls(models, plain):
    """While a logprobs request runs (the verify step implements no logprobs) the batch decodes in
    plain multi-step calls, which a draft model does not read; the first verify step after them
    catches the draft up, so a self-draft still accepts every draft (fails without the catch-up)."""
    llm = make(models, "target")
    engine = llm.engine
    engine.add_request("logprobs", PROMPTS[3], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True,
                                                              logprobs=1))
    engine.add_request("greedy", PROMPTS[0], GREEDY)
    ids: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            ids[out.request_id] = ids.get(out.request_id, []) + list(out.outputs[0].token_ids)
    assert ids["greedy"] == plain[0]
    metrics = engine.speculation_metrics()
    assert metrics["accepted"] == metrics["drafted"] > 0


def test_a_draft_further_behind_than_one_catch_up_drafts_only_once_caught_up(models):
    """After more plain positions than one verify call's catch-up reads (CATCH_UP_SPAN), the row
    first catches up drafting nothing: drafting past the gap in the draft's cache would have a
    self-draft reject, and an adaptive plan would read the pair's acceptance as low."""
    llm = make(models, "target")
    engine = llm.engine
    greedy = SamplingParams(max_tokens=96 - len(PROMPTS[0]) - 1, temperature=0, ignore_eos=True)
    expected = engine_ids(make(models, None), PROMPTS[:1], greedy)[0]
    plain_positions = CATCH_UP_SPAN + 12  # while the logprobs request runs, every call is plain
    engine.add_request("logprobs", PROMPTS[3], SamplingParams(max_tokens=plain_positions, temperature=0,
                                                              ignore_eos=True, logprobs=1))
    engine.add_request("greedy", PROMPTS[0], greedy)
    ids: list[int] = []
    while engine.has_unfinished():
        ids += [t for out in engine.step() if out.request_id == "greedy" for t in out.outputs[0].token_ids]
    assert ids == expected
    metrics = engine.speculation_metrics()
    assert metrics["accepted"] == metrics["drafted"] > 0


def test_first_verify_of_a_request_measures_with_one_round(models, plain):
    """An adaptive engine finds out a new request's acceptance in one verify round, then runs as
    many rounds per call as decode_steps allows (4 here) once the request is measured."""
    priced_to_pay = dict(adaptive=True, calibrate=False, draft_cost=0.0)
    llm = make(models, "target", priced_to_pay)
    engine, rounds = llm.engine, []
    dispatch = engine.runner.dispatch

    def recording(host, lap=lambda phase: None):
        if host.drafts is not None:
            rounds.append(host.num_rounds)
        return dispatch(host, lap)

    engine.runner.dispatch = recording
    assert engine_ids(llm, PROMPTS[:1], GREEDY) == plain[:1]
    assert rounds[0] == 1 and max(rounds) == engine.runner.spec_rounds == 4, rounds


def test_a_prefix_hit_on_pages_the_draft_read_skips_its_catch_up(models, plain):
    """Pages a draft has read are flagged in the block manager: a repeated prompt is admitted with
    the draft caught up to all but the last position of its cached pages, and a self-draft still
    accepts every draft (a flag on a page the draft had not read would make it reject)."""
    llm = make(models, "target")
    engine = llm.engine
    assert engine_ids(llm, PROMPTS[1:2], GREEDY) == plain[1:2]
    engine.add_request("again", PROMPTS[1], GREEDY)
    (request,) = engine.groups["again"]
    # its prefill (what the cache lacks) starts; its token comes with a later step's outputs
    ids = [t for out in engine.step() for t in out.outputs[0].token_ids]
    page_size = engine.config.page_size
    assert request.draft_computed == (len(PROMPTS[1]) - 1) // page_size * page_size - 1 > 0
    while engine.has_unfinished():
        ids += [t for out in engine.step() for t in out.outputs[0].token_ids]
    assert ids == plain[1]
    metrics = engine.speculation_metrics()
    assert metrics["accepted"] == metrics["drafted"] > 0


def recorded_steps(engine) -> list:
    """The host steps the engine dispatches from now on (appended as they start)."""
    steps, dispatch = [], engine.runner.dispatch

    def recording(host, lap=lambda phase: None):
        steps.append(host)
        return dispatch(host, lap)

    engine.runner.dispatch = recording
    return steps


def test_prompts_the_draft_did_not_read_are_caught_up_before_it_drafts(models, plain, monkeypatch):
    """Ragged steps run without the draft's reads (what the engine does while drafting cannot pay);
    the first verify step catches each row up first, so a self-draft still accepts every draft (a
    draft drafting over the unread prompt would reject)."""
    llm = make(models, "target")
    engine = llm.engine
    monkeypatch.setattr(engine.speculator, "reads_prompts", lambda rows: False)
    steps = recorded_steps(engine)
    assert engine_ids(llm, PROMPTS, GREEDY) == plain
    kinds = {host.shape[0] for host in steps}
    assert "ragged_unread" in kinds and "ragged" not in kinds and "verify" in kinds
    metrics = engine.speculation_metrics()
    assert metrics["accepted"] == metrics["drafted"] > 0


def test_an_engine_whose_drafts_cannot_pay_stops_reading_prompts(models, plain):
    """A draft step priced above a plain step: once a plan has declined, the draft reads no new
    prompt (its prefill would cost a draft forward for drafts nobody makes), the outputs are plain
    decoding's, and warm-up compiled the ragged steps without reads."""
    llm = make(models, "draft", dict(adaptive=True, calibrate=False, draft_cost=5.0))
    engine = llm.engine
    engine.warmup()
    traces = []
    monitoring.register_event_duration_secs_listener(
        lambda name, *a, **k: traces.append(name) if name.endswith("jaxpr_trace_duration") else None
    )
    assert engine_ids(llm, PROMPTS[:2], GREEDY) == plain[:2]  # the first prefill reads: nothing planned yet
    steps = recorded_steps(engine)
    assert engine_ids(llm, PROMPTS[2:], GREEDY) == plain[2:]
    reads = [host.draft_reads for host in steps if host.shape[0].startswith("ragged")]
    assert reads and not any(reads)
    assert engine.speculation_metrics()["drafted"] == 0 and traces == []


def test_prompts_are_read_where_the_rows_will_decode_at_a_bucket_that_pays():
    """Whether a prefill feeds the draft is decided at the row bucket its rows decode at: a plan
    that cannot pay at 64 rows (verifying 4 drafts a row costs 4 more steps there) leaves a lone
    request's prompt read."""
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=K, verify_saturation_tokens=16, calibrate=False)
    speculator = Speculator(spec)
    requests = [Request(f"r{i}", 0, None, [5, 6, 7], GREEDY, seed=0, stop_ids=()) for i in range(64)]
    assert speculator.plan(requests, 64) is None
    assert not speculator.reads_prompts(64) and speculator.reads_prompts(1)
