"""Calls written as JSON objects {"name": ..., "arguments": {...}} (Hermes, Llama-3, Mistral, Granite)."""

from __future__ import annotations

import json
from typing import Mapping, NamedTuple

import jaxinfer.entrypoints.openai.tool_parsers.json_stream as json_stream
from jaxinfer.entrypoints.openai.tool_parsers.incremental import (
    JSON_SPACE,
    Call,
    Malformed,
    Progress,
    Source,
    Wait,
    skip_space,
)

ARGUMENTS = ("arguments", "parameters")


class ParsedCall(NamedTuple):
    """A call read from a reply: its tool's name, its arguments as JSON text and the id the format writes for it
    (Kimi K2's `functions.NAME:IDX`, which its next turn's `tool_call_id` must give back; None: the server's own)."""

    name: str
    arguments: str
    id: str | None = None



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
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or item["name"] not in tools:
            return None
        arguments = item.get(arguments_key, item.get(ARGUMENTS[0], item.get(ARGUMENTS[1], {})))
        calls.append(ParsedCall(item["name"], json.dumps(arguments)))
    return calls or None


def stream_json_calls(src: Source, out: Progress, tools: Mapping[str, dict], arguments_key: str = "arguments") -> Wait:
    """The calls json_calls reads, as they stream: each call's name once its string ends, then its arguments
    in pieces (those under `arguments_key`; another key's once its call ends, it being second choice).
    Returns at the first character after them that is neither a value nor ";" (not taken)."""
    first = True
    while (char := (yield from skip_space(src))) in ("[", "{"):
        first = False
        if char == "[":
            yield from _stream_list(src, out, tools, arguments_key)
        else:
            yield from _stream_call(src, out, tools, arguments_key)
        if (yield from skip_space(src)) == ";":
            src.at += 1
    if first:
        raise Malformed(f"calls are JSON objects or lists of them, got {char!r}")


def _stream_list(src: Source, out: Progress, tools: Mapping[str, dict], arguments_key: str) -> Wait:
    """A JSON list of calls from its "["."""
    src.at += 1
    if (yield from skip_space(src, JSON_SPACE)) == "]":
        src.at += 1
        return
    while True:
        yield from _stream_call(src, out, tools, arguments_key)
        char = yield from skip_space(src, JSON_SPACE)
        src.at += 1
        if char == "]":
            return
        if char != ",":
            raise Malformed(f"{char!r} where a list of calls goes on or ends")


def _stream_call(src: Source, out: Progress, tools: Mapping[str, dict], arguments_key: str) -> Wait:
    """One {"name": ..., "arguments": ...} object; Malformed unless it is a call of one of the tools."""
    if (yield from skip_space(src, JSON_SPACE)) != "{":
        raise Malformed("a call must be a JSON object")
    src.at += 1
    call: Call | None = None
    held: dict[str, list[str]] = {}  # values written before the name, or under a key not streamed
    char = yield from skip_space(src, JSON_SPACE)
    while char != "}":
        if char != '"':
            raise Malformed(f"a JSON object key must be a string, got {char!r}")
        key = yield from json_stream.captured(src)
        if (yield from skip_space(src, JSON_SPACE)) != ":":
            raise Malformed("a JSON object key without ':'")
        src.at += 1
        if key == "name" and call is None:
            name = yield from json_stream.captured(src)
            call = out.call(name if isinstance(name, str) else "", tools)
            call.arguments = "".join(held.get(arguments_key, ()))
        else:
            streamed = key == arguments_key and call is not None and key not in held
            held[key] = []
            yield from json_stream.value(src, call.write if streamed else held[key].append)
        char = yield from skip_space(src, JSON_SPACE)
        if char not in (",", "}"):
            raise Malformed(f"{char!r} where a call object goes on or ends")
        if char == ",":
            src.at += 1
            if (char := (yield from skip_space(src, JSON_SPACE))) == "}":
                raise Malformed("a call object ends with ','")
    src.at += 1
    if call is None:
        raise Malformed("a call without a name")
    if arguments_key not in held:
        call.arguments = "".join(next((held[key] for key in ARGUMENTS if key in held), ["{}"]))

