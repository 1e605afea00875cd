"""Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, text around them content;
other markers around the same JSON (ERNIE-4.5's are these, LongCat's `<longcat_tool_call>`, Hunyuan-A13B's
`<tool_calls>` around a list) read the same way."""

from __future__ import annotations

import functools
import re
from typing import Mapping

from jaxinfer.entrypoints.openai.tool_parsers.incremental import (
    Malformed,
    Progress,
    Source,
    Wait,
    content_until,
    expect,
)
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall, json_calls, stream_json_calls

START, END = "<tool_call>", "</tool_call>"


@functools.cache
def block_pattern(start: str, end: str) -> re.Pattern:
    """A block between the markers, its inside (space around it cut) the group."""
    return re.compile(rf"{re.escape(start)}\s*(.*?)\s*{re.escape(end)}", re.S)


def read(text: str, tools: Mapping[str, dict], start: str = START, end: str = END
         ) -> tuple[list[ParsedCall], str] | None:
    """The blocks' calls and the text outside them; None when a block is not a call of a known tool or is
    left open."""
    calls, block = [], block_pattern(start, end)
    for inside in block.findall(text):
        found = json_calls(inside, tools)
        if found is None:
            return None
        calls += found
    rest = block.sub("", text)
    return (calls, rest) if calls and start not in rest else None  # a block left open: not a call


def stream(src: Source, out: Progress, tools: Mapping[str, dict], start: str = START, end: str = END) -> Wait:
    """Content up to each block, the block's calls as they stream (incremental.py)."""
    while True:
        yield from content_until(src, out, start)
        yield from stream_json_calls(src, out, tools)
        if not (yield from expect(src, end)):
            raise Malformed(f"a {start} block holds more than calls")
