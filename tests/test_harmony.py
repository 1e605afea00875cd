"""The openai_gptoss reasoning parser (harmony.py through reasoning.py's API): GPT-OSS's channels split into
reasoning and content, whole and streamed at every split position, with no marker in either part."""

from __future__ import annotations

import pytest

from jaxinfer.entrypoints.openai.harmony import MARKERS, message_route, partial_marker
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
