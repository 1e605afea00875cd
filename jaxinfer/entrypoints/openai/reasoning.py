"""Reasoning apart from the answer (vLLM's `--reasoning-parser`): `<think> ... </think>` is reasoning, the rest content.

- deepseek_r1 (DeepSeek-R1 and its distills, QwQ): the chat template may open `<think>` in the prompt, so an
  output is reasoning up to its first `</think>` whether or not it opens with `<think>`; unclosed, all of it is;
- qwen3 (Qwen3 in thinking mode): reasoning only when the output opens with `<think>` (up to `</think>`, or
  all of it while unclosed); else all of it is content (thinking off, or a model that skipped it).

Pure text functions: `split_text` splits a finished output, `split_delta` a stream's text deltas, holding
back what may be the start of a tag until the next delta (or the last) tells.
"""

from __future__ import annotations

import dataclasses

START, END = "<think>", "</think>"


@dataclasses.dataclass(frozen=True)
class ReasoningParser:
    """A parser by name; `implicit`: an output that does not open with `<think>` is still reasoning."""

    name: str
    implicit: bool


PARSERS = {"deepseek_r1": ReasoningParser("deepseek_r1", True), "qwen3": ReasoningParser("qwen3", False)}


def reasoning_parser(name: str) -> ReasoningParser:
    """The parser called `name`; a ValueError naming the accepted ones otherwise."""
    if name not in PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; accepted: {', '.join(PARSERS)}")
    return PARSERS[name]


@dataclasses.dataclass(frozen=True)
class SplitState:
    """Where an output is: "open" (whether `<think>` opens it is not known yet), "reasoning" or "content".

    held: text kept back, a possible tag (or the whitespace before one) not yet seen whole.
    thought: a reasoning part was entered (so a finished output's reasoning is a string, not None).
    """

    phase: str
    implicit: bool
    held: str = ""
    thought: bool = False


def start_split(parser: ReasoningParser, implicit: bool = True) -> SplitState:
    """The state before an output's first delta; implicit=False (a constrained output, or thinking turned off
    by the request) makes an output that does not open with `<think>` content, whatever the parser."""
    return SplitState("open", parser.implicit and implicit)


def split_delta(state: SplitState, delta: str, final: bool = False) -> tuple[SplitState, str, str]:
    """(next state, reasoning delta, content delta) of one text delta; `final` (the output's last) releases
    what was held back."""
    text, phase, reasoning = state.held + delta, state.phase, ""
    if phase == "open":
        stripped = text.lstrip()
        if stripped.startswith(START):
            phase, text = "reasoning", stripped[len(START):]
        elif START.startswith(stripped) and not final:  # whitespace, or a prefix of "<think>": wait
            return dataclasses.replace(state, held=text), "", ""
        else:
            phase = "reasoning" if state.implicit else "content"
    thought = state.thought or phase == "reasoning"
    if phase == "reasoning":
        at = text.find(END)
        if at < 0:
            keep = 0 if final else partial_tag(text, END)
            cut = len(text) - keep
            return SplitState("reasoning", state.implicit, text[cut:], thought), text[:cut], ""
        reasoning, text = text[:at], text[at + len(END):]
    return SplitState("content", state.implicit, "", thought), reasoning, text


def partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag` (and is shorter than it)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def split_text(state: SplitState, text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of a finished output, as vLLM returns them: reasoning None when there was
    none; content None when the output ends in (or right after) its reasoning."""
    state, reasoning, content = split_delta(state, text, final=True)
    if not state.thought:
        return None, content
    return reasoning, content or None
