"""DeepSeek-V3 / R1: `<｜tool▁calls▁begin｜>`, then per call `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`,
a fenced ```json block of its arguments and `<｜tool▁call▁end｜>`, then `<｜tool▁calls▁end｜>`."""

from __future__ import annotations

import json
import re
from typing import Mapping

from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall

START, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL = re.compile(r"\s*<｜tool▁call▁begin｜>[^<]*<｜tool▁sep｜>(.*?)\n```json\n(.*?)\n```\s*<｜tool▁call▁end｜>", re.S)


def read(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """The calls up to the end marker (or the reply's end) and the text after it; None unless the span is
    calls of known tools."""
    span, _, after = text[len(START):].partition(END)
    calls, at = [], 0
    while found := CALL.match(span, at):
        name = found[1].strip()
        try:
            arguments = json.loads(found[2])
        except json.JSONDecodeError:
            return None
        if name not in tools or not isinstance(arguments, dict):
            return None
        calls.append((name, json.dumps(arguments)))
        at = found.end()
    return (calls, after) if calls and not span[at:].strip() else None
