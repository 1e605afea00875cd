"""Mistral: `[TOOL_CALLS]` then a JSON list of {"name", "arguments"} (tokenizers before v11), or, from v11,
`[TOOL_CALLS]NAME[ARGS]{...}` per call. `[TOOL_CALLS]` is a control token: the text must keep special tokens."""

from __future__ import annotations

import json
from typing import Mapping

import jaxinfer.entrypoints.openai.tool_parsers.json_stream as json_stream
from jaxinfer.entrypoints.openai.tool_parsers.incremental import (
    JSON_SPACE,
    Malformed,
    Progress,
    Source,
    Wait,
    content_until,
    expect,
    name_check,
    skip_space,
    until,
)
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall, json_calls, stream_json_calls

START, ARGS = "[TOOL_CALLS]", "[ARGS]"


def read(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """The calls after the marker (all the rest is calls); None unless they are calls of known tools."""
    body = text[len(START):]
    if body.lstrip()[:1] in ("[", "{"):
        calls = json_calls(body, tools)
        return None if calls is None else (calls, "")
    calls = [_named_call(piece, tools) for piece in body.split(START)]
    return None if None in calls else (calls, "")


def _named_call(piece: str, tools: Mapping[str, dict]) -> ParsedCall | None:
    """One v11 call `NAME[ARGS]{...}`."""
    name, marker, arguments = piece.partition(ARGS)
    if not marker or name.strip() not in tools:
        return None
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    return ParsedCall(name.strip(), json.dumps(value)) if isinstance(value, dict) else None


def stream(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
    """Content up to the marker, then the calls as they stream (incremental.py): a JSON list's, or each v11
    call's name at its `[ARGS]` and then its arguments."""
    yield from content_until(src, out, START)
    if (yield from skip_space(src)) in ("[", "{"):
        yield from stream_json_calls(src, out, tools)
        raise Malformed("text after the calls")
    while True:
        name, _ = yield from until(src, (ARGS,), name_check(tools))
        call = out.call(name.strip(), tools)
        if (yield from skip_space(src, JSON_SPACE)) != "{":
            raise Malformed(f"{ARGS} must be followed by a JSON object")
        yield from json_stream.value(src, call.write)
        yield from skip_space(src, JSON_SPACE)
        if not (yield from expect(src, START)):
            raise Malformed("text after a call")
