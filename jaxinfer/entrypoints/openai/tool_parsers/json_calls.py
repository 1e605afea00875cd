"""Calls written as JSON objects {"name": ..., "arguments": {...}} (Hermes, Llama-3, Mistral, Granite)."""

from __future__ import annotations

import json
from typing import Mapping

ParsedCall = tuple[str, str]  # (tool name, arguments as JSON text)


def json_calls(text: str, tools: Mapping[str, dict], arguments_key: str = "arguments") -> list[ParsedCall] | None:
    """Calls from JSON text: an array of calls or calls separated by ";" (None unless all are calls of known tools)."""
    decoder, items, at = json.JSONDecoder(), [], 0
    text = text.strip()
    try:
        while at < len(text):
            value, at = decoder.raw_decode(text, at)
            items += value if isinstance(value, list) else [value]
            at = len(text) - len(text[at:].lstrip().removeprefix(";").lstrip())
    except json.JSONDecodeError:
        return None
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in tools:
            return None
        arguments = item.get(arguments_key, item.get("arguments", item.get("parameters", {})))
        calls.append((item["name"], json.dumps(arguments)))
    return calls or None
