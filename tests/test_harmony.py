"""The openai_gptoss reasoning parser (harmony.py through reasoning.py's API): GPT-OSS's channels split into
reasoning and content, whole and streamed at every split position, with no marker in either part."""

from __future__ import annotations

import pytest

from jaxinfer.entrypoints.openai.harmony import (
    MARKERS,
    HarmonyCall,
    function_name,
    harmony_calls,
    harmony_delta,
    message_route,
    partial_marker,
    start_harmony,
)
from jaxinfer.entrypoints.openai.reasoning import reasoning_parser, split_delta, split_text, start_split

ANALYSIS = "<|channel|>analysis<|message|>{}<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>{}<|return|>"
CALL = "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{{}}<|call|>"

CASES = {  # output -> (reasoning, content), as vLLM's parse_chat_output gives them
    ANALYSIS.format("think hard") + FINAL.format("the answer"): ("think hard", "the answer"),
    ANALYSIS.format("only thinking"): ("only thinking", None),
    "<|channel|>analysis<|message|>cut off at max_tok": ("cut off at max_tok", None),
    "<|channel|>final<|message|>answer at once<|return|>": (None, "answer at once"),
    ANALYSIS.format("a") + "<|start|>assistant<|channel|>final<|message|>eos stripped": ("a", "eos stripped"),
    ANALYSIS.format("I need the time") + CALL: ("I need the time", None),
    "<|channel|>commentary<|message|>Checking.<|end|>" + CALL: (None, "Checking."),
    ANALYSIS.format("one") + ANALYSIS.replace("<|ch", "<|start|>assistant<|ch").format("two"): ("one\ntwo", None),
    ANALYSIS.format("r") + "<|start|>assistant<|channel|>commentary<|message|>pre<|end|>" + FINAL.format("fin"):
        ("r", "pre\nfin"),
    "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>": (None, None),
    "<|channel|>secret<|message|>hidden<|end|>" + FINAL.format("shown"): (None, "shown"),
    "no harmony markers at all": (None, None),
    "<|channel|>analy": (None, None),
    ANALYSIS.format("x") + "stray text<|start|>assistant<|channel|>final<|message|>y<|endoftext|>": ("x", "y"),
    "<|channel|>final<|message|>a < b, <|not a marker|> <| <<|return|>": (None, "a < b, <|not a marker|> <| <"),
    ANALYSIS.format("skipped the end") + "<|channel|>final<|message|>z": ("skipped the end", "z"),
    ANALYSIS.format("") + FINAL.format(""): (None, None),
}


def gptoss(implicit: bool = True):
    return start_split(reasoning_parser("openai_gptoss"), implicit)


def streamed(text: str, cuts: list[int], implicit: bool = True) -> tuple[str, str]:
    """The reasoning and content deltas of `text` sent in pieces cut at `cuts`, joined."""
    state, reasoning, content = gptoss(implicit), "", ""
    bounds = [0, *cuts, len(text)]
    for i, (start, end) in enumerate(zip(bounds, bounds[1:])):
        state, r, c = split_delta(state, text[start:end], final=i == len(bounds) - 2)
        assert not any(m in r or m in c for m in MARKERS)
        reasoning, content = reasoning + r, content + c
    return reasoning, content


@pytest.mark.parametrize("text", CASES)
def test_whole_output_splits_as_vllm(text):
    assert split_text(gptoss(), text) == CASES[text]


@pytest.mark.parametrize("text", CASES)
def test_streamed_at_every_split_and_token_by_char_gives_the_whole_split(text):
    reasoning, content = CASES[text]
    expected = (reasoning or "", content or "")
    for cut in range(len(text) + 1):
        assert streamed(text, [cut]) == expected, cut
    assert streamed(text, list(range(1, len(text)))) == expected


def test_a_marker_cut_across_deltas_is_held_until_whole():
    state, reasoning, content = split_delta(gptoss(), "<|channel|>final<|message|>ok<|ret")
    assert (reasoning, content, state.held) == ("", "ok", "<|ret")
    state, reasoning, content = split_delta(state, "urn|>")
    assert (reasoning, content, state.held) == ("", "", "")
    assert partial_marker("a <") == 1 and partial_marker("a <|x") == 0 and partial_marker("<|end|>") == 0


def test_a_constrained_output_outside_any_message_is_content():
    assert split_text(gptoss(implicit=False), "plain json {}") == (None, "plain json {}")
    text = ANALYSIS.format("t") + FINAL.format("f")
    assert split_text(gptoss(implicit=False), text) == ("t", "f")
    assert streamed("plain", [2], implicit=False) == ("", "plain")


@pytest.mark.parametrize("header, route", [
    ("<|channel|>analysis", "reasoning"), ("assistant<|channel|>analysis to=browser.search", "reasoning"),
    ("<|channel|>final", "content"), ("<|channel|>commentary", "content"),
    ("<|channel|>commentary to=functions.f <|constrain|>json", ""),
    ("assistant to=functions.f<|channel|>commentary", ""),
    ("assistant", ""), ("<|channel|>unknown", ""),
])
def test_message_route_follows_vllm(header, route):
    assert message_route(header) == route


WEATHER = '{"city": "Paris"}'
CALL_CASES = {  # output -> its function calls (name, arguments as written, ended)
    ANALYSIS.format("I need the time") + CALL.format(): [("get_time", "{}", True)],
    "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" + WEATHER + "<|call|>":
        [("get_weather", WEATHER, True)],
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + WEATHER:
        [("get_weather", WEATHER, False)],  # stopped on <|call|>, which the text lacks
    ANALYSIS.format("two") + CALL.format() + CALL.replace("get_time", "get_date").format().replace("{}", '{"d": 1}'):
        [("get_time", "{}", True), ("get_date", '{"d": 1}', True)],
    "<|channel|>commentary<|message|>Checking.<|end|>" + CALL.format(): [("get_time", "{}", True)],
    ANALYSIS.format("x") + "<|start|>assistant<|channel|>commentary to=functions.f<|message|>a < b<|channel|>final"
        "<|message|>y": [("f", "a < b", True)],  # the model skipped the call's end
    ANALYSIS.format("think hard") + FINAL.format("the answer"): [],
    "<|channel|>commentary to=browser.search<|message|>{}<|end|>": [],
    "<|channel|>analysis to=functions.f<|message|>{}<|end|>": [],
    "no harmony markers at all": [],
}


def calls_of(state) -> list[tuple[str, str, bool]]:
    return [(c.name, c.arguments, c.ended) for c in state.calls]


@pytest.mark.parametrize("text", CALL_CASES)
def test_function_calls_are_reported_whole_and_streamed_at_every_split(text):
    expected = CALL_CASES[text]
    assert [(c.name, c.arguments, c.ended) for c in harmony_calls(start_harmony(), text)] == expected
    for cuts in [*([cut] for cut in range(len(text) + 1)), list(range(1, len(text)))]:
        state, bounds = start_harmony(), [0, *cuts, len(text)]
        for i, (start, end) in enumerate(zip(bounds, bounds[1:])):
            state, _, _ = harmony_delta(state, text[start:end], final=i == len(bounds) - 2)
        assert calls_of(state) == expected, cuts


def test_a_call_is_neither_reasoning_nor_content_and_opens_when_its_body_does():
    assert split_text(gptoss(), ANALYSIS.format("t") + CALL) == ("t", None)
    state, _, _ = harmony_delta(start_harmony(), "<|channel|>commentary to=functions.f json<|message|>")
    assert state.calls == (HarmonyCall("f"),)
    assert function_name("assistant to=functions.f<|channel|>commentary") == "f"
    assert function_name("<|channel|>commentary to=functions.") is None
    assert function_name("<|channel|>commentary") is None
