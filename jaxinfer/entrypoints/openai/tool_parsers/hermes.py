"""Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, text around them content."""

from __future__ import annotations

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
BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def read(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """The blocks' calls and the text outside them; None when a block is not a call of a known tool or is
    left open."""
    calls = []
    for block in BLOCK.findall(text):
        found = json_calls(block, tools)
        if found is None:
            return None
        calls += found
    rest = BLOCK.sub("", text)
    return (calls, rest) if calls and START not in rest else None  # a block left open: not a call


def stream(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
    """Content up to each block, the block's calls as they stream (incremental.py)."""
    while True:
        yield from content_until(src, out, START)
        yield from stream_json_calls(src, out, tools)
        if not (yield from expect(src, END)):
            raise Malformed(f"a {START} block holds more than calls")
