"""Step-3: `<｜tool_calls_begin｜>`, then per call `<｜tool_call_begin｜>function<｜tool_sep｜>` and
`<steptml:invoke name="NAME"><steptml:parameter name="k">v</steptml:parameter>...</steptml:invoke>` and
`<｜tool_call_end｜>`, then `<｜tool_calls_end｜>`. The markers are special tokens: the text must keep them. The
values are text, the space around them cut, typed by the tool's schema (values.py), as MiniMax-M2's invokes
(minimax_m2.py) are read."""

from __future__ import annotations

import re
from typing import Mapping

from jaxinfer.entrypoints.openai.tool_parsers.incremental import (
    Malformed,
    Progress,
    Source,
    Wait,
    content_rest,
    content_until,
    expect,
    skip_space,
    until,
)
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall
from jaxinfer.entrypoints.openai.tool_parsers.minimax_m2 import InvokeTags, invoke
from jaxinfer.entrypoints.openai.tool_parsers.values import arguments_json

START, END = "<｜tool_calls_begin｜>", "<｜tool_calls_end｜>"
CALL_BEGIN, SEP, CALL_END = "<｜tool_call_begin｜>", "<｜tool_sep｜>", "<｜tool_call_end｜>"
STEP = InvokeTags('<steptml:invoke name="', "</steptml:invoke>", '<steptml:parameter name="', "</steptml:parameter>")
CALL = re.compile(r'\s*<｜tool_call_begin｜>\s*function\s*<｜tool_sep｜>\s*<steptml:invoke name="([^"]*)">(.*?)'
                  r"</steptml:invoke>\s*<｜tool_call_end｜>", re.S)
PARAMETER_PAIR = re.compile(r'<steptml:parameter name="([^"]*)">(.*?)</steptml:parameter>', re.S)


def read(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """The calls up to the end marker (or the reply's end) and the text after it; None unless the span is
    calls of known tools."""
    span, _, after = text[len(START):].partition(END)
    calls, at = [], 0
    while found := CALL.match(span, at):
        name, body = found[1].strip(), found[2]
        if name not in tools or PARAMETER_PAIR.sub("", body).strip():
            return None
        pairs = [(key.strip(), value.strip()) for key, value in PARAMETER_PAIR.findall(body)]
        calls.append(ParsedCall(name, arguments_json(name, pairs, tools)))
        at = found.end()
    return (calls, after) if calls and not span[at:].strip() else None


def stream(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
    """Content up to the marker, each call's name at the `">` after it and its parameters as minimax_m2 streams
    them, and the text after the end marker as content."""
    yield from content_until(src, out, START)
    while (yield from skip_space(src)) and not (yield from expect(src, END)):
        if not (yield from expect(src, CALL_BEGIN)):
            raise Malformed(f"{START} must be followed by calls")
        kind, _ = yield from until(src, (SEP,), _function)
        if kind.strip() != "function":
            raise Malformed(f"a call of type {kind.strip()[:20]!r}")
        yield from skip_space(src)
        if not (yield from expect(src, STEP.invoke)):
            raise Malformed(f'{SEP} must be followed by {STEP.invoke}NAME">')
        yield from invoke(src, out, tools, STEP)
        yield from skip_space(src)
        if not (yield from expect(src, CALL_END)):
            raise Malformed("text after a call's invoke")
    yield from content_rest(src, out)


def _function(text: str) -> None:
    """The call's type being written: Malformed once it cannot be `function`."""
    if not "function".startswith(text.strip()):
        raise Malformed(f"a call of type {text.strip()[:20]!r}")
