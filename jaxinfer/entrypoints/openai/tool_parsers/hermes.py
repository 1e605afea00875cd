"""Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, text around them content."""

from __future__ import annotations

import re
from typing import Mapping

from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall, json_calls

START = "<tool_call>"
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
