"""Reasoning apart from the answer (vLLM's `--reasoning-parser`): `<think> ... </think>` is reasoning, the rest
content; or, for GPT-OSS, the harmony format's analysis channel is reasoning and its final channel content.

- deepseek_r1 (DeepSeek-R1 and its distills, QwQ): the chat template may open `<think>` in the prompt, so an
  output is reasoning up to its first `</think>` whether or not it opens with `<think>`; unclosed, all of it is;
- qwen3 (Qwen3 in thinking mode): reasoning only when the output opens with `<think>` (up to `</think>`, or
  all of it while unclosed); else all of it is content (thinking off, or a model that skipped it);
- openai_gptoss (GPT-OSS): harmony channels, read from the text with its special tokens kept (harmony.py).

Pure text functions: `split_text` splits a finished output, `split_delta` a stream's text deltas, holding
back what may be the start of a tag until the next delta (or the last) tells.
"""

from __future__ import annotations

import dataclasses

from jaxinfer.entrypoints.openai.harmony import HarmonyState, harmony_delta, harmony_text, start_harmony

START, END = "<think>", "</think>"


@dataclasses.dataclass(frozen=True)
class ReasoningParser:
    """A parser by name; `implicit`: an output that does not open with `<think>` is still reasoning;
    `harmony`: the output is in GPT-OSS's harmony format, whose markers are special tokens the text must keep."""

    name: str
    implicit: bool
    harmony: bool = False


PARSERS = {
    "deepseek_r1": ReasoningParser("deepseek_r1", True),
    "qwen3": ReasoningParser("qwen3", False),
    "openai_gptoss": ReasoningParser("openai_gptoss", True, harmony=True),
}


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


Split = SplitState | HarmonyState


def start_split(parser: ReasoningParser, implicit: bool = True) -> Split:
    """The state before an output's first delta; implicit=False (a constrained output, or thinking turned off
    by the request) makes an output that does not open with `<think>` content, whatever the parser (harmony:
    makes text outside any message content)."""
    if parser.harmony:
        return start_harmony(implicit)
    return SplitState("open", parser.implicit and implicit)


def split_delta(state: Split, delta: str, final: bool = False) -> tuple[Split, str, str]:
    """(next state, reasoning delta, content delta) of one text delta; `final` (the output's last) releases
    what was held back."""
    if isinstance(state, HarmonyState):
        return harmony_delta(state, delta, final)
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


def split_text(state: Split, text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of a finished output, as vLLM returns them: reasoning None when there was
    none; content None when the output ends in (or right after) its reasoning (harmony: either None when empty)."""
    if isinstance(state, HarmonyState):
        return harmony_text(state, text)
    state, reasoning, content = split_delta(state, text, final=True)
    return (reasoning, final_content(state, content)) if state.thought else (None, content)


def final_content(state: Split, content: str) -> str | None:
    """A finished output's whole content as vLLM gives it: None when empty after a reasoning (harmony: when
    empty at all), else the text."""
    empty_is_none = isinstance(state, HarmonyState) or state.thought
    return None if empty_is_none and not content else content
