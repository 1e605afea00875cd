"""Streams and generate of one LLM share its engine: each request's outputs reach its own reader whole."""

from __future__ import annotations

import pytest

from jaxinfer import LLM, RequestOutput, SamplingParams
from jaxinfer.engine.outputs import accumulate

PROMPTS = ["def add(a, b):", "class Stack:"]
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(text_model_dir):
    return LLM(text_model_dir, dtype="float32", max_seq_len=128, decode_steps=4, stream_interval=1)


@pytest.fixture(scope="module")
def solo(llm) -> list[RequestOutput]:
    """Each prompt's greedy output, run alone."""
    return [llm.generate(p, GREEDY)[0] for p in PROMPTS]


def _in_turns(streams: list) -> list[list]:
    """Advance the iterators alternately with next() until all are exhausted; what each yielded."""
    got: list[list] = [[] for _ in streams]
    live = set(range(len(streams)))
    while live:
        for i in sorted(live):
            item = next(streams[i], None)
            if item is None:
                live.discard(i)
            else:
                got[i].append(item)
    return got


def _total(deltas: list[RequestOutput]) -> RequestOutput:
    total = None
    for delta in deltas:
        total = accumulate(total, delta)
    return total


def test_two_streams_consumed_in_turns_each_give_their_request_alone(llm, solo):
    deltas, pieces = _in_turns([llm.stream(PROMPTS[0], GREEDY), llm.stream_text(PROMPTS[1], GREEDY)])
    total = _total(deltas)
    assert (total.text, total.token_ids, total.finish_reason) == (solo[0].text, solo[0].token_ids, "length")
    assert len(deltas) > 1 and [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert "".join(pieces) == solo[1].text
    assert not llm.engine.has_unfinished()


def test_closing_one_stream_aborts_it_alone(llm, solo):
    free = llm.engine.blocks.usable_pages
    first, second = llm.stream_text(PROMPTS[0], GREEDY), llm.stream_text(PROMPTS[1], GREEDY)
    next(first)
    head = next(second)
    first.close()
    assert head + "".join(second) == solo[1].text
    assert not llm.engine.has_unfinished() and llm.engine.blocks.usable_pages == free


def test_generate_while_a_stream_is_paused_leaves_both_whole(llm, solo):
    paused = llm.stream_text(PROMPTS[0], GREEDY)
    head = next(paused)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == [o.token_ids for o in solo]
    assert head + "".join(paused) == solo[0].text


def test_stream_with_n_2_yields_every_sample(llm):
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=5, n=2, ignore_eos=True)
    whole = llm.generate(PROMPTS[0], params)[0]
    deltas = list(llm.stream(PROMPTS[0], params))
    total = _total(deltas)
    assert [(o.index, o.token_ids, o.text) for o in total.outputs] == [(o.index, o.token_ids, o.text) for o in whole.outputs]
    assert [o.finish_reason for o in total.outputs] == ["length", "length"] and deltas[-1].finished
    with pytest.raises(ValueError, match=r"stream_text.*n=2.*stream\(\)"):
        next(llm.stream_text(PROMPTS[0], params))


@pytest.mark.parametrize("prompts", [["a", "b"], [[5, 6], [7]]])
def test_stream_of_several_prompts_says_to_use_generate(llm, prompts):
    with pytest.raises(TypeError, match=r"stream takes one prompt .* got a list of 2 prompts; use generate"):
        next(llm.stream(prompts))


def test_a_stream_gets_its_tokens_each_step(llm, solo):
    """decode_steps=4, stream_interval=1: a watched request's tokens come one call (one token) at a time."""
    deltas = list(llm.stream(PROMPTS[0], GREEDY))
    sizes = [len(o.token_ids) for d in deltas for o in d.outputs]
    assert max(sizes) == 1 and sum(sizes) == GREEDY.max_tokens
    assert _total(deltas).outputs[0].token_ids == solo[0].outputs[0].token_ids
