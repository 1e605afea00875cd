"""Llama-3: the whole reply is JSON calls {"name": ..., "parameters": {...}}, several separated by ";"."""

from __future__ import annotations

from typing import Mapping

from jaxinfer.entrypoints.openai.tool_parsers.incremental import Malformed, Progress, Source, Wait
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall, json_calls, stream_json_calls


def read(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """The calls (no content beside them); None unless the reply is calls of known tools."""
    calls = json_calls(text, tools, "parameters")
    return None if calls is None else (calls, "")


def stream(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
    """The calls as they stream (incremental.py); nothing may follow them."""
    yield from stream_json_calls(src, out, tools, "parameters")
    raise Malformed("text after the calls")
