"""overlap_outputs: step() starts the next device call before it builds the last one's outputs.

The overlapped engine must give what the step-synchronous one gives (tokens, text, logprobs,
finish reasons) under any mix, and keep its guarantees when a request is aborted, or a call
fails, while the call is in flight.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_knobs import ENGINE
from engine_runs import engines_with_and_without, summary

from jaxinfer import LLM, SamplingParams

PROMPTS = [np.random.RandomState(i).randint(3, 250, size=n).tolist() for i, n in enumerate([5, 37, 9, 21, 1, 50])]
MIXED = [
    SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=3),
    SamplingParams(max_tokens=30, temperature=0.9, seed=4, ignore_eos=True),
    SamplingParams(max_tokens=20, temperature=0, stop=["a", "e"]),
    SamplingParams(max_tokens=9, temperature=1.0, seed=2, n=2, presence_penalty=0.4),
    SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
    SamplingParams(max_tokens=6, temperature=0.7, seed=9, min_tokens=4),
]


@pytest.fixture(scope="module")
def engines(text_model_dir) -> dict[bool, LLM]:
    """The same model, step-synchronous and overlapped; a pool smaller than the shared one, filled one prefill
    a step, so the mix preempts (what the first test checks the overlap through)."""
    return engines_with_and_without(text_model_dir, "overlap_outputs", **{**ENGINE, "num_pages": 10,
                                                                          "max_prefill_seqs": 1})


def test_overlapped_outputs_equal_step_synchronous_ones(engines):
    synchronous, overlapped = (summary(engines[o].generate(PROMPTS, MIXED)) for o in (False, True))
    assert overlapped == synchronous
    assert engines[True].metrics()["num_preemptions"] > 0  # the mix ran through preemption too


def test_streams_join_to_the_same_text(engines):
    params = SamplingParams(max_tokens=25, temperature=0, ignore_eos=True)
    pieces = {o: "".join(engines[o].stream_text(PROMPTS[1], params)) for o in (False, True)}
    assert pieces[True] == pieces[False] == engines[False].generate([PROMPTS[1]], params)[0].text


def test_each_step_returns_the_outputs_of_the_call_before_it(engines):
    engine = engines[True].engine
    engine.add_request("one", PROMPTS[0], SamplingParams(max_tokens=9, temperature=0, ignore_eos=True))
    assert engine.step() == [] and engine.in_flight is not None  # the prefill runs; no tokens yet
    counts = []
    while engine.has_unfinished():
        counts += [len(out.outputs[0].token_ids) for out in engine.step()]
    assert counts == [1, 4, 4] and engine.in_flight is None  # the first token, then two 4-step calls


def test_a_request_aborted_in_flight_ends_at_once_and_the_others_are_unchanged(engines):
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    expected = [out.outputs[0].token_ids for out in engines[False].generate(PROMPTS[:3], params)]
    engine = engines[True].engine
    for i, prompt in enumerate(PROMPTS[:3]):
        engine.add_request(str(i), prompt, params)
    got: dict[str, list[int]] = {str(i): [] for i in range(3)}
    finals = {}
    for _ in range(4):
        for out in engine.step():
            got[out.request_id] += out.outputs[0].token_ids
    assert engine.in_flight is not None and "1" in {r.request_id for r in engine.in_flight.host.requests if r}
    at_abort = list(engine.groups["1"][0].output_ids)
    engine.abort("1")
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id] += out.outputs[0].token_ids
            finals[out.request_id] = out.outputs[0].finish_reason
    assert finals["1"] == "abort" and got["1"] == at_abort == expected[1][: len(at_abort)]  # nothing after it
    assert [got["0"], got["2"]] == [expected[0], expected[2]]
    assert engine.blocks.usable_pages == engine.blocks.num_pages - 1  # every page but the null page
    engine.release()  # nothing is left in flight to land
    assert engine.in_flight is None


def test_a_call_failing_when_it_lands_fails_its_requests_alone(engines, monkeypatch):
    llm = engines[True]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    expected = llm.generate([PROMPTS[4]], params)[0].outputs[0].token_ids
    engine, read, failed = llm.engine, llm.engine.runner.read, []

    def failing_once(packed):
        if not failed:
            failed.append(True)
            raise RuntimeError("device error found when reading")
        return read(packed)

    monkeypatch.setattr(engine.runner, "read", failing_once)
    engine.add_request("lost", PROMPTS[3], params)
    assert engine.step() == []  # its prefill is in flight
    engine.add_request("later", PROMPTS[4], params)
    ids, finals = {"lost": [], "later": []}, {}
    while engine.has_unfinished():
        for out in engine.step():
            ids[out.request_id] += out.outputs[0].token_ids
            if out.finished:
                finals[out.request_id] = out
    assert finals["lost"].outputs[0].finish_reason == "error" and "device error" in finals["lost"].error
    assert ids == {"lost": [], "later": expected}
