"""Qwen3-Coder: `<tool_call>\\n<function=NAME>\\n<parameter=k>\\nv\\n</parameter>\\n</function>\\n</tool_call>`;
the values are text (one newline each side is the format's), typed by the tool's schema (values.py)."""

from __future__ import annotations

import re
from typing import Mapping

from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall
from jaxinfer.entrypoints.openai.tool_parsers.values import arguments_json

START = "<tool_call>"
BLOCK = re.compile(r"<tool_call>\s*<function=([^>\n]*)>(.*?)</function>\s*</tool_call>", re.S)
PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.S)


def read(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """The blocks' calls and the text outside them; None when a block is not a call of a known tool or is
    left open."""
    calls = []
    for name, body in BLOCK.findall(text):
        name = name.strip()
        if name not in tools or PARAMETER.sub("", body).strip():
            return None
        pairs = [(key.strip(), _value(value)) for key, value in PARAMETER.findall(body)]
        calls.append((name, arguments_json(name, pairs, tools)))
    rest = BLOCK.sub("", text)
    return (calls, rest) if calls and START not in rest else None  # a block left open: not a call


def _value(text: str) -> str:
    """A parameter's text without the newline the format writes on each side."""
    return text.removeprefix("\n").removesuffix("\n")
