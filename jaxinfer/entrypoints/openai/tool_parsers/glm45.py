"""GLM-4.5: `<tool_call>NAME` then `<arg_key>k</arg_key><arg_value>v</arg_value>` pairs, `</tool_call>`; the
values are text, typed by the tool's schema (values.py). Text outside the blocks is content."""

from __future__ import annotations

import re
from typing import Mapping

from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall
from jaxinfer.entrypoints.openai.tool_parsers.values import arguments_json

START = "<tool_call>"
BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def read(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """The blocks' calls and the text outside them; None when a block is not a call of a known tool or is
    left open."""
    calls = []
    for block in BLOCK.findall(text):
        name, marker, pairs = block.partition("<arg_key>")
        name, pairs = name.strip(), marker + pairs
        if name not in tools or PAIR.sub("", pairs).strip():
            return None
        calls.append((name, arguments_json(name, PAIR.findall(pairs), tools)))
    rest = BLOCK.sub("", text)
    return (calls, rest) if calls and START not in rest else None  # a block left open: not a call
