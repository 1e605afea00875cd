"""Granite (3.0): `<|tool_call|>` then a JSON list of {"name", "arguments"}; the marker is a special token.
Phi-4-mini writes the same after `functools`."""

from __future__ import annotations

from typing import Mapping

from jaxinfer.entrypoints.openai.tool_parsers.incremental import Malformed, Progress, Source, Wait, content_until
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall, json_calls, stream_json_calls

START = "<|tool_call|>"


def read(text: str, tools: Mapping[str, dict], start: str = START) -> tuple[list[ParsedCall], str] | None:
    """The calls after the marker (all the rest is calls); None unless they are calls of known tools."""
    calls = json_calls(text[len(start):], tools)
    return None if calls is None else (calls, "")


def stream(src: Source, out: Progress, tools: Mapping[str, dict], start: str = START) -> Wait:
    """Content up to the marker, then the calls as they stream (incremental.py); nothing may follow them."""
    yield from content_until(src, out, start)
    yield from stream_json_calls(src, out, tools)
    raise Malformed("text after the calls")
