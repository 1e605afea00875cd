"""async_scheduling: a multi-step decode call starts before the one ahead of it lands.

The chained call's rows read their tokens and lengths from the device (each slot's decode carry),
so the host neither waits for the call ahead nor knows where its rows stand when it plans: the
engine must give exactly what it gives without chaining (tokens, text, logprobs, finish
reasons), whichever row ends inside the call ahead (a stop id, max_tokens, a stop string, an
abort), and keep its guarantees when that call fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_knobs import ENGINE
from engine_runs import engines_with_and_without, summary

from jaxinfer import LLM, SamplingParams, SpeculativeConfig

PROMPTS = [np.random.RandomState(10 + i).randint(3, 250, size=n).tolist() for i, n in enumerate([5, 19, 9, 27])]


@pytest.fixture(scope="module")
def engines(text_model_dir) -> dict[bool, LLM]:
    """The same model with and without async scheduling (both overlap outputs)."""
    return engines_with_and_without(text_model_dir, "async_scheduling", **ENGINE)


def chained_calls(llm: LLM) -> int:
    return llm.metrics()["engine_chained_calls"]


def test_chained_calls_give_the_outputs_of_unchained_ones(engines):
    greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    stop_at = engines[False].generate([PROMPTS[0]], greedy)[0].outputs[0].token_ids[13]  # inside a later call
    mix = [
        SamplingParams(max_tokens=40, temperature=0, stop_token_ids=[stop_at], ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=33, temperature=0.9, seed=4, ignore_eos=True, presence_penalty=0.5),
        SamplingParams(max_tokens=30, temperature=0, stop=["e"]),
        SamplingParams(max_tokens=22, temperature=1.0, seed=2, n=2, min_tokens=9, frequency_penalty=0.3),
    ]
    before = chained_calls(engines[True])
    plain, chained = (summary(engines[c].generate(PROMPTS, mix)) for c in (False, True))
    assert chained == plain
    assert plain[0][0][2] == "stop" and plain[0][0][0][-1] == stop_at  # the stop id ended it on the device
    assert chained_calls(engines[True]) > before and chained_calls(engines[False]) == 0


def test_streams_join_to_the_same_text(engines):
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    before = chained_calls(engines[True])
    pieces = {c: "".join(engines[c].stream_text(PROMPTS[1], params)) for c in (False, True)}
    assert pieces[True] == pieces[False] == engines[False].generate([PROMPTS[1]], params)[0].text
    assert chained_calls(engines[True]) > before


def test_a_request_aborted_while_two_calls_are_queued_ends_at_once(engines):
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    expected = [out.outputs[0].token_ids for out in engines[False].generate(PROMPTS[:2], params)]
    engine = engines[True].engine
    for i, prompt in enumerate(PROMPTS[:2]):
        engine.add_request(str(i), prompt, params)
    got: dict[str, list[int]] = {"0": [], "1": []}
    before = engine.stats.engine_chained_calls
    while engine.stats.engine_chained_calls == before:  # until a step started a call behind another
        for out in engine.step():
            got[out.request_id] += out.outputs[0].token_ids
    assert engine.in_flight.carried  # the call behind is in flight; the one it followed landed
    at_abort = list(engine.groups["1"][0].output_ids)
    engine.abort("1")
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id] += out.outputs[0].token_ids
            finals[out.request_id] = out.outputs[0].finish_reason
    assert finals["1"] == "abort" and got["1"] == at_abort == expected[1][: len(at_abort)]
    assert got["0"] == expected[0]
    assert engine.blocks.usable_pages == engine.blocks.num_pages - 1  # every page back but the null page


def test_a_call_failing_with_a_call_behind_it_fails_its_requests_alone(engines, monkeypatch):
    llm = engines[True]
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    expected = llm.generate([PROMPTS[3]], params)[0].outputs[0].token_ids
    engine, read, failed = llm.engine, llm.engine.runner.read, []

    def failing_with_a_call_behind(packed):
        if not failed and engine.chained is not None:
            failed.append(True)
            raise RuntimeError("device error found when reading")
        return read(packed)

    monkeypatch.setattr(engine.runner, "read", failing_with_a_call_behind)
    engine.add_request("lost", PROMPTS[2], params)
    ids, finals = {"lost": [], "later": []}, {}
    while engine.has_unfinished():
        for out in engine.step():
            ids[out.request_id] += out.outputs[0].token_ids
            if out.finished:
                finals[out.request_id] = out
    assert failed and finals["lost"].outputs[0].finish_reason == "error" and "device error" in finals["lost"].error
    assert engine.in_flight is None and engine.blocks.usable_pages == engine.blocks.num_pages - 1
    engine.add_request("later", PROMPTS[3], params)  # the rebuilt pools serve the next request exactly
    while engine.has_unfinished():
        for out in engine.step():
            ids[out.request_id] += out.outputs[0].token_ids
    assert ids["later"] == expected


def test_a_speculating_engine_chains_only_the_calls_its_plan_decodes_plainly(text_model_dir):
    """While a penalized row keeps the batch plain, calls chain; once it ends the plan (asked before
    the call ahead lands) drafts for the repeating row, which then verifies: the tokens are the same."""
    loop = (PROMPTS[0] * 4)[:18]
    prompts = [loop, PROMPTS[1]]
    params = [SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, presence_penalty=0.5)]
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, adaptive=False)
    llms = engines_with_and_without(text_model_dir, "async_scheduling", speculative=spec, **ENGINE)
    plain, chained = (summary(llms[c].generate(prompts, params)) for c in (False, True))
    assert chained == plain
    assert chained_calls(llms[True]) > 0 and llms[True].engine.speculation_metrics()["drafted"] > 0


def test_host_drafts_are_planned_on_landed_tokens(text_model_dir):
    """Prompt lookup finds a match only in tokens the call in flight makes: a request's first
    declined plans chain nothing, so a short request drafts as the unchained engine does; after
    two declines in a row one call is chained (`Speculator.declines`), and the lookup still drafts
    once the text repeats. Outputs are the unchained engine's."""
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3)  # the file's other verify programs' K
    drafted, outs = {}, {}
    for c in (False, True):
        llm = LLM(text_model_dir, async_scheduling=c, speculative=spec, **ENGINE)
        outs[c] = [summary(llm.generate(["a b c a b c a b c a b"], SamplingParams(max_tokens=n, temperature=0)))
                   for n in (6, 40)]
        drafted[c] = llm.metrics()["drafted"]
    assert outs[True] == outs[False]
    assert drafted[True] > 0 and drafted[False] > 0
