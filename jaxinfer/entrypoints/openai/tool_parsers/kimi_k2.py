"""Kimi K2: `<|tool_calls_section_begin|>`, then per call `<|tool_call_begin|>functions.NAME:IDX`,
`<|tool_call_argument_begin|>`, its arguments as a JSON object and `<|tool_call_end|>`, then
`<|tool_calls_section_end|>` (the singular `<|tool_call_section_begin|>` / `..._end|>` that some checkpoints
write too, as vLLM reads them). The markers are special tokens: the text must keep them. The call's name is
read from its id `functions.NAME:IDX` (the `functions.` prefix optional, as vLLM reads it), and the id is the
call's (vLLM's too): Kimi's chat template writes it back as the next turn's `tool_call_id`."""

from __future__ import annotations

import json
import re
from typing import Callable, Generator, Mapping

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
    skip_space,
    until,
)
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall

START, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
SINGULAR_START, SINGULAR_END = "<|tool_call_section_begin|>", "<|tool_call_section_end|>"
CALL_BEGIN, ARGUMENTS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
PREFIX = "functions."
CALL = re.compile(r"\s*<\|tool_call_begin\|>([^<]*)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.S)
CALL_ID = re.compile(r"(?:functions\.)?([^\s:<]+):[0-9]+")  # the call's id, stripped: its name and its index
INDEX_SO_FAR = re.compile(r"(?:[0-9]+\s*)?")


def read(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """The calls (their ids kept) up to the section's end marker (or the reply's end) and the text after it; None
    unless the section is calls of known tools."""
    body = text[len(START if text.startswith(START) else SINGULAR_START):]
    ends = [at for marker in (END, SINGULAR_END) if (at := body.find(marker)) >= 0]
    cut = min(ends, default=len(body))
    span, after = body[:cut], body[cut:].removeprefix(END).removeprefix(SINGULAR_END)
    calls, at = [], 0
    while found := CALL.match(span, at):
        name = _name(found[1])
        try:
            arguments = json.loads(found[2])
        except json.JSONDecodeError:
            return None
        if name not in tools or not isinstance(arguments, dict):
            return None
        calls.append(ParsedCall(name, json.dumps(arguments), found[1].strip()))
        at = found.end()
    return (calls, after) if calls and not span[at:].strip() else None


def _name(call_id: str) -> str | None:
    """The tool name in a call's id `functions.NAME:IDX` (space around it allowed); None if it is not one."""
    found = CALL_ID.fullmatch(call_id.strip())
    return found[1] if found else None


def stream(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
    """Content up to the section marker, each call's name and id at `<|tool_call_argument_begin|>` and then its
    arguments (incremental.py), and the text after the section's end marker as content."""
    yield from content_until(src, out, START, SINGULAR_START)
    while (yield from skip_space(src)) and not (yield from _section_end(src)):
        if not (yield from expect(src, CALL_BEGIN)):
            raise Malformed(f"{START} must be followed by calls")
        call_id, _ = yield from until(src, (ARGUMENTS,), _id_check(tools))
        call = out.call(_name(call_id) or "", tools, call_id.strip())
        if (yield from skip_space(src, JSON_SPACE)) != "{":
            raise Malformed("a call's arguments must be a JSON object")
        yield from json_stream.value(src, call.write)
        yield from skip_space(src, JSON_SPACE)
        if not (yield from expect(src, CALL_END)):
            raise Malformed("text after a call's arguments")
    yield from content_rest(src, out)


def _section_end(src: Source) -> Generator[None, None, bool]:
    """Takes the section's end marker, either form, when the text goes on with one."""
    return (yield from expect(src, END)) or (yield from expect(src, SINGULAR_END))


def _id_check(tools: Mapping[str, dict]) -> Callable[[str], None]:
    """A check for `until` on a call's id being written: Malformed once it can be no `functions.NAME:IDX`
    of the tools' names."""
    def check(text: str) -> None:
        head, colon, index = text.lstrip().partition(":")
        name = head.removeprefix(PREFIX)
        if colon:
            fits = name in tools and INDEX_SO_FAR.fullmatch(index) is not None
        else:
            fits = PREFIX.startswith(head) or any(tool.startswith(name) for tool in tools)
        if not fits:
            raise Malformed(f"{text.strip()[:40]!r} is not the id of a call of the request's tools")
    return check
