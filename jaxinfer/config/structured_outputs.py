"""`StructuredOutputsParams`: what a request's output must match (vLLM's shape), checked on construction.

Exactly one constraint per request: a JSON schema (`json`, a dict or its text), any JSON object
(`json_object=True`), a regular expression (`regex`), one of a list of strings (`choice`) or a
Lark / GBNF grammar (`grammar`). Whether the schema, pattern or grammar compiles is checked when
the engine compiles it (the grammar library names the problem); here only the shapes.
"""

from __future__ import annotations

import dataclasses
import json as json_module
from typing import Any, Mapping, Sequence

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclasses.dataclass(frozen=True)
class StructuredOutputsParams:
    """One output constraint; `kind` names it and `spec` is its canonical text (the compile cache's key)."""

    json: str | Mapping[str, Any] | None = None
    regex: str | None = None
    choice: Sequence[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        given = [name for name in KINDS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs takes exactly one of {', '.join(KINDS)}; got "
                             f"{', '.join(given) if given else 'none'}")
        if self.json is not None:
            object.__setattr__(self, "json", _schema(self.json))
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"structured_outputs.{name} must be a non-empty string, got {value!r:.80}")
        if self.choice is not None:
            object.__setattr__(self, "choice", _choice(self.choice))
        if self.json_object is not None and self.json_object is not True:
            raise TypeError(f"structured_outputs.json_object must be True or None, got {self.json_object!r}")

    def __hash__(self) -> int:
        return hash((self.kind, self.spec))

    @property
    def kind(self) -> str:
        """Which constraint: one of KINDS."""
        return next(name for name in KINDS if getattr(self, name) not in (None, False))

    @property
    def spec(self) -> str:
        """The constraint as text: the schema as compact JSON in its own key order (order is output order),
        the choices as a JSON list, the pattern or grammar as given; "" for json_object."""
        if self.json is not None:
            return self.json if isinstance(self.json, str) else json_module.dumps(self.json, separators=(",", ":"))
        if self.choice is not None:
            return json_module.dumps(list(self.choice))
        return self.regex or self.grammar or ""


def _schema(value: object) -> str | Mapping[str, Any]:
    """A JSON schema as a dict, or as text that parses to an object (or true)."""
    if isinstance(value, Mapping):
        return value
    if not isinstance(value, str):
        raise TypeError(f"structured_outputs.json must be a JSON schema (a dict or its JSON text), "
                        f"got {type(value).__name__}")
    try:
        parsed = json_module.loads(value)
    except ValueError as error:
        raise ValueError(f"structured_outputs.json is not valid JSON: {error}") from None
    if not isinstance(parsed, dict) and parsed is not True:
        raise ValueError(f"structured_outputs.json must be a JSON object (a schema), got {value!r:.80}")
    return value


def _choice(value: object) -> tuple[str, ...]:
    """A non-empty list of strings."""
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise TypeError(f"structured_outputs.choice must be a non-empty list of strings, got {value!r:.80}")
    bad = [i for i, item in enumerate(value) if not isinstance(item, str)]
    if bad:
        raise TypeError(f"structured_outputs.choice[{bad[0]}] must be a string, got {value[bad[0]]!r:.80}")
    return tuple(value)
