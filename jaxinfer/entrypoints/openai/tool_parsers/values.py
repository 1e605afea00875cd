"""Argument values a format writes as text (GLM-4.5, Qwen3-Coder), typed as the tool's JSON schema says."""

from __future__ import annotations

import json
from typing import Any, Mapping

KINDS = {"integer": (int,), "number": (int, float), "boolean": (bool,), "object": (dict,), "array": (list,),
         "null": (type(None),)}


def typed_value(text: str, schema: Mapping | None) -> Any:
    """The value of `text` for a parameter's schema: a string stays text; another declared type is read as
    JSON when it gives that type (True/False for booleans too); no declared type: JSON when it parses; else text."""
    kind = (schema or {}).get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    if "string" in kinds:
        return text
    if "boolean" in kinds and text.strip() in ("True", "False"):
        return text.strip() == "True"
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    accepted = tuple(t for k in kinds for t in KINDS.get(k, ()))
    fits = not kinds or (isinstance(value, accepted) and not (isinstance(value, bool) and bool not in accepted))
    return value if fits else text


def argument_piece(count: int, key: str, value: Any) -> str:
    """What json.dumps writes of the arguments' key and value after `count` others (with the "{" or ", " before)."""
    return ("{" if count == 0 else ", ") + json.dumps(key) + ": " + json.dumps(value)


def arguments_end(count: int) -> str:
    """What json.dumps writes after the arguments' last of `count` keys."""
    return "}" if count else "{}"


def arguments_json(name: str, pairs: list[tuple[str, str]], tools: Mapping[str, dict]) -> str:
    """The call's arguments as JSON text, each value typed by its parameter's schema."""
    properties = tools[name].get("properties") or {}
    return json.dumps({key: typed_value(value, properties.get(key)) for key, value in pairs})
