"""Argument values a format writes as text (GLM-4.5, Qwen3-Coder), typed as the tool's JSON schema says."""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

KINDS = {"integer": (int,), "number": (int, float), "boolean": (bool,), "object": (dict,), "array": (list,),
         "null": (type(None),)}


def typed_value(text: str, schema: Mapping | None) -> Any:
    """The value of `text` for a parameter's schema: a string stays text; another declared type is read as
    JSON when it gives that type (True/False for booleans too), or null (an optional argument left out, as vLLM
    reads it whatever the declared type); no declared type: JSON when it parses; else text. A string parameter's
    "null" stays text: it is streamed as text before its end is seen."""
    kinds = _kinds(schema)
    if "string" in kinds:
        return text
    if "boolean" in kinds and text.strip() in ("True", "False"):
        return text.strip() == "True"
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    accepted = tuple(t for k in kinds for t in KINDS.get(k, ()))
    fits = value is None or not kinds or (
        isinstance(value, accepted) and not (isinstance(value, bool) and bool not in accepted))
    return value if fits else text


def is_text(schema: Mapping | None) -> bool:
    """The parameter's value stays text whatever it holds (its schema allows a string), so it can be written
    out as it comes."""
    return "string" in _kinds(schema)


def _kinds(schema: Mapping | None) -> list[str]:
    kind = (schema or {}).get("type")
    return kind if isinstance(kind, list) else [kind] if kind else []


def argument_key(count: int, key: str) -> str:
    """What json.dumps writes of the arguments' key after `count` others (with the "{" or ", " before it)."""
    return ("{" if count == 0 else ", ") + json.dumps(key) + ": "


def argument_piece(count: int, key: str, value: Any) -> str:
    """What json.dumps writes of the arguments' key and value after `count` others."""
    return argument_key(count, key) + json.dumps(value)


def text_writer(write: Callable[[str], None]) -> Callable[[str], None]:
    """`write` for a JSON string's text: pieces of it as json.dumps escapes them (each character alone)."""
    return lambda piece: write(json.dumps(piece)[1:-1])


def arguments_end(count: int) -> str:
    """What json.dumps writes after the arguments' last of `count` keys."""
    return "}" if count else "{}"


def arguments_json(name: str, pairs: list[tuple[str, str]], tools: Mapping[str, dict]) -> str:
    """The call's arguments as JSON text, each value typed by its parameter's schema."""
    properties = tools[name].get("properties") or {}
    return json.dumps({key: typed_value(value, properties.get(key)) for key, value in pairs})
