"""GPT-OSS's harmony replies split into reasoning and content (vLLM's `openai_gptoss` reasoning parser).

A harmony reply is a run of messages, each a header, `<|message|>`, its text and an end marker:
`<|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>final<|message|>answer<|return|>`
(the prompt ends with `<|start|>assistant`, so the first header comes without it). As vLLM splits them:
the analysis channel is reasoning; the final channel and commentary without a recipient (a preamble to
tool calls) are content; a commentary message to a recipient (`to=functions.NAME`: a tool call) and any
other channel are neither. Several messages of one kind are joined by a newline. Markers are never in
either part, and text outside any message is dropped, as vLLM's parser drops it; a constrained output
(implicit=False) starts outside a message as plain text, so there that text is content.

The tool calls are kept apart as data: each commentary message to `functions.NAME` (the recipient before
or after the channel) is a `HarmonyCall`, its text the arguments, in the state's `calls` (tool_calls.py
makes them OpenAI tool calls when the request has tools).

The markers are special tokens, so the reply must be detokenized with them (skip_special_tokens=False).
Pure text functions, streamed like reasoning.py's: a marker cut across deltas is held back until whole.
"""

from __future__ import annotations

import dataclasses
import re

ENDS = ("<|end|>", "<|return|>", "<|call|>", "<|endoftext|>")  # what ends a message (the last three, a reply)
MARKERS = (*ENDS, "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>")
MARKER = re.compile("|".join(map(re.escape, MARKERS)))
CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")
RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")
FUNCTIONS = "functions."


@dataclasses.dataclass(frozen=True)
class HarmonyCall:
    """A commentary message to `functions.NAME`: a call of NAME, its text (so far) the arguments as written.
    ended: its end marker (or the next message) came; the last call of a reply stopped on `<|call|>` may lack
    it, the stop token not being in the text."""

    name: str
    arguments: str = ""
    ended: bool = False


@dataclasses.dataclass(frozen=True)
class HarmonyState:
    """Where a reply is: reading a message's "header" (up to `<|message|>`) or a "body" whose text goes to
    `route` ("reasoning", "content", "call": the last of `calls`, or "": dropped).

    implicit: text outside a message is dropped (vLLM's); False: it is content.
    header: the header read so far. held: a possible marker not yet seen whole.
    spoke: this message sent text. said: the routes earlier messages sent text to (a new one is joined by "\\n").
    """

    phase: str
    implicit: bool
    route: str = ""
    header: str = ""
    held: str = ""
    spoke: bool = False
    said: frozenset[str] = frozenset()
    calls: tuple[HarmonyCall, ...] = ()


def start_harmony(implicit: bool = True) -> HarmonyState:
    """The state before a reply's first delta: inside the first message's header, or (implicit=False)
    outside any message, where plain text is content."""
    return HarmonyState("header", True) if implicit else HarmonyState("body", False, route="content")


def harmony_delta(state: HarmonyState, delta: str, final: bool = False) -> tuple[HarmonyState, str, str]:
    """(next state, reasoning delta, content delta) of one text delta; `final` releases what was held back."""
    text = state.held + delta
    keep = 0 if final else partial_marker(text)
    text, held = text[: len(text) - keep], text[len(text) - keep:]
    parts = {"reasoning": [], "content": []}
    while text:
        found = MARKER.search(text)
        at = found.start() if found else len(text)
        state = _read(state, text[:at], parts)
        if found:
            state = _after_marker(state, found.group())
        text = text[found.end():] if found else ""
    return dataclasses.replace(state, held=held), "".join(parts["reasoning"]), "".join(parts["content"])


def partial_marker(text: str) -> int:
    """Length of the end of `text` that may begin a marker (all start with "<" and hold no other one)."""
    at = text.rfind("<")
    tail = text[at:] if at >= 0 else ""
    return len(tail) if any(len(tail) < len(m) and m.startswith(tail) for m in MARKERS) else 0


def _read(state: HarmonyState, text: str, parts: dict[str, list[str]]) -> HarmonyState:
    """Text between markers: part of the header, or the body's text sent to its route."""
    if not text:
        return state
    if state.phase == "header":
        return dataclasses.replace(state, header=state.header + text)
    if state.route == "call":
        *done, call = state.calls
        return dataclasses.replace(state, calls=(*done, dataclasses.replace(call, arguments=call.arguments + text)))
    if not state.route:
        return state
    joined = "\n" if not state.spoke and state.route in state.said else ""
    parts[state.route].append(joined + text)
    return dataclasses.replace(state, spoke=True, said=state.said | {state.route})


def _after_marker(state: HarmonyState, marker: str) -> HarmonyState:
    """The state a marker leads to: `<|message|>` ends a header, an end marker a message, `<|start|>` (or a
    `<|channel|>` in a body, the model having skipped the end) begins a header; the rest stay in a header."""
    if state.phase == "body" and state.route == "call" and marker not in ("<|message|>", "<|constrain|>"):
        *done, call = state.calls
        state = dataclasses.replace(state, route="", calls=(*done, dataclasses.replace(call, ended=True)))
    if marker in ENDS:
        return _outside(state)
    if marker == "<|start|>":
        return dataclasses.replace(state, phase="header", header="", spoke=False)
    if state.phase == "header":
        if marker == "<|message|>":
            return _body(state)
        return dataclasses.replace(state, header=state.header + marker)
    if marker == "<|channel|>":
        return dataclasses.replace(state, phase="header", header=marker, spoke=False)
    return state  # a stray <|message|> or <|constrain|> in a body: a marker, so not text


def _body(state: HarmonyState) -> HarmonyState:
    """The state at a message's `<|message|>`: its text routed by its header; a function call opens a new call."""
    name = function_name(state.header)
    if name is None:
        return dataclasses.replace(state, phase="body", route=message_route(state.header), spoke=False)
    return dataclasses.replace(state, phase="body", route="call", spoke=False, calls=(*state.calls, HarmonyCall(name)))


def _outside(state: HarmonyState) -> HarmonyState:
    """Between messages: text there is dropped, or content for a constrained output."""
    route = "" if state.implicit else "content"
    return dataclasses.replace(state, phase="body", route=route, header="", spoke=False)


def message_route(header: str) -> str:
    """Where a message's text goes, from its header ("assistant<|channel|>commentary to=functions.f json")."""
    channel = CHANNEL.search(header)
    name = channel.group(1) if channel else ""
    if name == "analysis":
        return "reasoning"
    if name == "final" or (name == "commentary" and not RECIPIENT.search(header)):
        return "content"
    return ""


def function_name(header: str) -> str | None:
    """NAME of a commentary message to `functions.NAME` (a tool call), else None."""
    channel, recipient = CHANNEL.search(header), RECIPIENT.search(header)
    if not channel or channel.group(1) != "commentary" or not recipient:
        return None
    to = recipient.group(1)
    return to[len(FUNCTIONS):] if to.startswith(FUNCTIONS) and len(to) > len(FUNCTIONS) else None


def harmony_text(state: HarmonyState, text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of a finished reply, each None when empty (vLLM's)."""
    _, reasoning, content = harmony_delta(state, text, final=True)
    return reasoning or None, content or None


def harmony_calls(state: HarmonyState, text: str) -> tuple[HarmonyCall, ...]:
    """The function calls of a finished reply, in order."""
    return harmony_delta(state, text, final=True)[0].calls
