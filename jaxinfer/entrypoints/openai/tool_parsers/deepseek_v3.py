"""DeepSeek-V3 / R1: `<｜tool▁calls▁begin｜>`, then per call `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`,
a fenced ```json block of its arguments and `<｜tool▁call▁end｜>`, then `<｜tool▁calls▁end｜>`. DeepSeek-V3.1 writes
`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` (no type, no fence) between the same markers."""

from __future__ import annotations

import json
import re
from typing import Mapping

import jaxinfer.entrypoints.openai.tool_parsers.json_stream as json_stream
from jaxinfer.entrypoints.openai.tool_parsers.incremental import (
    JSON_SPACE,
    Malformed,
    Progress,
    Source,
    Wait,
    content_rest,
    content_until,
    expect,
    name_check,
    skip_space,
    until,
)
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall

START, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, SEP, FENCE, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "\n```json\n", "<｜tool▁call▁end｜>"
CALL = re.compile(r"\s*<｜tool▁call▁begin｜>[^<]*<｜tool▁sep｜>(.*?)\n```json\n(.*?)\n```\s*<｜tool▁call▁end｜>", re.S)
V31_CALL = re.compile(r"\s*<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.S)


def read(text: str, tools: Mapping[str, dict], call: re.Pattern = CALL) -> tuple[list[ParsedCall], str] | None:
    """The calls up to the end marker (or the reply's end) and the text after it; None unless the span is
    calls of known tools."""
    span, _, after = text[len(START):].partition(END)
    calls, at = [], 0
    while found := call.match(span, at):
        name = found[1].strip()
        try:
            arguments = json.loads(found[2])
        except json.JSONDecodeError:
            return None
        if name not in tools or not isinstance(arguments, dict):
            return None
        calls.append(ParsedCall(name, json.dumps(arguments)))
        at = found.end()
    return (calls, after) if calls and not span[at:].strip() else None


def read_v31(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """`read` of DeepSeek-V3.1's calls."""
    return read(text, tools, V31_CALL)


def stream(src: Source, out: Progress, tools: Mapping[str, dict], fenced: bool = True) -> Wait:
    """Content up to the marker, each call's name at its fence (V3.1: its separator) and then its arguments
    (incremental.py), and the text after the end marker as content."""
    yield from content_until(src, out, START)
    while (yield from skip_space(src)) and not (yield from expect(src, END)):
        if not (yield from expect(src, CALL_BEGIN)):
            raise Malformed(f"{START} must be followed by calls")
        if fenced:
            yield from until(src, (SEP,), _no_tag)
        name, _ = yield from until(src, (FENCE if fenced else SEP,), name_check(tools))
        call = out.call(name.strip(), tools)
        if (yield from skip_space(src, JSON_SPACE)) != "{":
            raise Malformed("a call's arguments must be a JSON object")
        yield from json_stream.value(src, call.write)
        yield from skip_space(src)
        closed = not fenced or ((yield from expect(src, "```")) and (yield from skip_space(src)))
        if not (closed and (yield from expect(src, CALL_END))):
            raise Malformed("text after a call's arguments")
    yield from content_rest(src, out)


def stream_v31(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
    """`stream` of DeepSeek-V3.1's calls."""
    yield from stream(src, out, tools, fenced=False)


def _no_tag(text: str) -> None:
    """The call's type (`function`) holds no tag."""
    if "<" in text:
        raise Malformed("a tag before the call's name")
