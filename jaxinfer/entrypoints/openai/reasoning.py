"""Reasoning apart from the answer (vLLM's `--reasoning-parser`): the text between a format's start and end tags
(reasoning_parsers.py: `<think> ... </think>` and others) is reasoning, the rest content; or, for GPT-OSS, the
harmony format's analysis channel is reasoning and its final channel content.

Pure text functions: `split_text` splits a finished output, `split_delta` a stream's text deltas, holding
back what may be the start of a tag until the next delta (or the last) tells.
"""

from __future__ import annotations

import dataclasses

from jaxinfer.entrypoints.openai.harmony import HarmonyState, harmony_delta, harmony_text, start_harmony
from jaxinfer.entrypoints.openai.reasoning_parsers import PARSERS, ReasoningParser, reasoning_parser

__all__ = ["PARSERS", "ReasoningParser", "reasoning_parser", "SplitState", "Split", "start_split", "split_delta",
           "split_text", "final_content", "partial_tag"]


@dataclasses.dataclass(frozen=True)
class SplitState:
    """Where an output is: "open" (whether a start tag opens it is not known yet), "reasoning", or past it:
    "content", or with an answer wrapper "answer_open" (whether its open tag comes is not known yet), "answer"
    (inside it) and "done" (after its close: dropped).

    held: text kept back, a possible tag (or the whitespace before one) not yet seen whole.
    thought: a reasoning part was entered (so a finished output's reasoning is a string, not None).
    """

    parser: ReasoningParser
    phase: str
    implicit: bool
    held: str = ""
    thought: bool = False


Split = SplitState | HarmonyState


def start_split(parser: ReasoningParser, implicit: bool = True, thinking: bool | None = None) -> Split:
    """The state before an output's first delta; implicit=False (a constrained output) or thinking=False (the
    request turned it off; None: the parser's default) make an output that does not open with a start tag
    content, whatever the parser (harmony: make text outside any message content); thinking off under a parser
    whose off means no reasoning (deepseek_v3, kimi_k2) makes all of it content."""
    thinking = parser.thinking_default if thinking is None else thinking
    if parser.harmony:
        return start_harmony(implicit and thinking)
    if (not thinking and parser.off_is_content) or not (parser.ends or parser.kept_ends):
        return SplitState(parser, _after_reasoning(parser), False, parser.prefix)
    return SplitState(parser, "open", parser.implicit and implicit and thinking)


def split_delta(state: Split, delta: str, final: bool = False) -> tuple[Split, str, str]:
    """(next state, reasoning delta, content delta) of one text delta; `final` (the output's last) releases
    what was held back."""
    if isinstance(state, HarmonyState):
        return harmony_delta(state, delta, final)
    parser, text, phase, reasoning = state.parser, state.held + delta, state.phase, ""
    if phase == "open":
        stripped = text.lstrip()
        tag = next((tag for tag in parser.starts if stripped.startswith(tag)), None)
        if tag is not None:
            phase, text = "reasoning", stripped[len(tag):]
        elif any(tag.startswith(stripped) for tag in parser.starts) and not final:  # may be a start tag: wait
            return dataclasses.replace(state, held=text), "", ""
        else:
            phase = "reasoning" if state.implicit else _after_reasoning(parser)
    thought = state.thought or phase == "reasoning"
    if phase == "reasoning":
        ends = parser.ends + parser.kept_ends
        found = [(at, tag) for tag in ends if (at := text.find(tag)) >= 0]
        if not found:
            keep = 0 if final else max(partial_tag(text, tag) for tag in ends)
            cut = len(text) - keep
            return dataclasses.replace(state, phase="reasoning", held=text[cut:], thought=thought), text[:cut], ""
        at, tag = min(found)
        reasoning, text = text[:at], text[at if tag in parser.kept_ends else at + len(tag):]
        phase = _after_reasoning(parser)
    phase, held, content = _answer(parser, phase, text, final)
    return SplitState(parser, phase, state.implicit, held, thought), reasoning, content


def _after_reasoning(parser: ReasoningParser) -> str:
    """The phase of the text after the reasoning (or of an output without one)."""
    return "answer_open" if parser.answer else "content"


def _answer(parser: ReasoningParser, phase: str, text: str, final: bool) -> tuple[str, str, str]:
    """(phase, held, content) of text after the reasoning: an answer wrapper's tags dropped where the text
    (past its leading space) opens with the open tag, and what follows its close."""
    if phase == "answer_open":
        opening = parser.answer[0]
        stripped = text.lstrip()
        if stripped.startswith(opening):
            phase, text = "answer", stripped[len(opening):]
        elif opening.startswith(stripped) and not final:
            return phase, text, ""
        else:
            return "content", "", text
    if phase == "answer":
        closing = parser.answer[1]
        at = text.find(closing)
        if at >= 0:
            return "done", "", text[:at]
        cut = len(text) - (0 if final else partial_tag(text, closing))
        return phase, text[cut:], text[:cut]
    return phase, "", "" if phase == "done" else text


def partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag` (and is shorter than it)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def split_text(state: Split, text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of a finished output, as vLLM returns them: reasoning None when there was
    none; content None when the output ends in (or right after) its reasoning (harmony: either None when empty)."""
    if isinstance(state, HarmonyState):
        return harmony_text(state, text)
    state, reasoning, content = split_delta(state, text, final=True)
    if not state.thought:
        return None, content
    return None if state.parser.empty_reasoning_none and not reasoning else reasoning, final_content(state, content)


def final_content(state: Split, content: str) -> str | None:
    """A finished output's whole content as vLLM gives it: None when empty after a reasoning (harmony: when
    empty at all), else the text."""
    empty_is_none = isinstance(state, HarmonyState) or state.thought
    return None if empty_is_none and not content else content
