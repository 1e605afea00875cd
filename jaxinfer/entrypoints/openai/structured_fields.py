"""The request fields that constrain the output as one `StructuredOutputsParams`: OpenAI's
`response_format`, vLLM's `structured_outputs` and its older `guided_json`/`guided_regex`/
`guided_choice`/`guided_grammar`. Each problem is a 400 naming the field; the constraint is compiled
here, in the request's worker thread (cached for the engine), so a schema that does not compile is a
400 before anything is queued, and the step loop never waits for a compile.
"""

from __future__ import annotations

from typing import Any

from jaxinfer.config.structured_outputs import KINDS, StructuredOutputsParams
from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.serving import ServerState

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def requested_constraint(body: Any) -> tuple[StructuredOutputsParams | None, str | None]:
    """(the body's output constraint, the field that gave it); (None, None) when it asks for none."""
    found = []
    fmt = response_format(getattr(body, "response_format", None))
    if fmt is not None:
        found.append(("response_format" if fmt.json_object else "response_format.json_schema.schema", fmt))
    if getattr(body, "structured_outputs", None) is not None:
        found.append(("structured_outputs", _params("structured_outputs", body.structured_outputs)))
    for field, kind in GUIDED.items():
        value = getattr(body, field, None)
        if value is not None:
            found.append((field, _params(field, {kind: value})))
    if len(found) > 1:
        names = ", ".join(field for field, _ in found)
        raise APIError(f"{names} each constrain the output; give one of them", param=found[1][0])
    return (found[0][1], found[0][0]) if found else (None, None)


def response_format(value: dict | None) -> StructuredOutputsParams | None:
    """OpenAI's response_format: text (no constraint), json_object, or json_schema {name, schema, strict}."""
    if value is None:
        return None
    kind = value.get("type")
    if kind not in RESPONSE_FORMATS:
        raise APIError(f"response_format.type must be one of {', '.join(RESPONSE_FORMATS)}, got {kind!r}",
                       param="response_format.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise APIError('response_format.json_schema must be {"name": ..., "schema": {...}, "strict": ...}, '
                       f"got {spec!r:.80}", param="response_format.json_schema")
    # OpenAI lets the schema be left out ("any JSON"); strict is always honoured here (decoding is masked).
    return _params("response_format.json_schema.schema", {"json": spec.get("schema") or {"type": "object"}})


def _params(field: str, fields: Any) -> StructuredOutputsParams:
    """StructuredOutputsParams(**fields), its errors as 400s naming the request field."""
    if not isinstance(fields, dict):
        raise APIError(f"{field} must be an object with one of {', '.join(KINDS)}, got {fields!r:.80}", param=field)
    unknown = sorted(set(fields) - set(KINDS))
    if unknown:
        raise APIError(f"{field}: unknown key {unknown[0]!r}; accepted keys: {', '.join(KINDS)}", param=field)
    try:
        return StructuredOutputsParams(**fields)
    except (TypeError, ValueError) as error:
        raise APIError(f"{field}: {error}", param=field) from None


def compile_constraint(state: ServerState, constraint: StructuredOutputsParams, field: str) -> None:
    """Compile the constraint into the engine's cache now; a 400 naming the field when it does not compile."""
    try:
        state.engine.engine.structured.grammars.matcher(constraint)
    except ValueError as error:  # the engine's message names its own field: name the request's instead
        message = str(error).replace(f"structured_outputs.{constraint.kind} ", "", 1)
        raise APIError(f"{field}: {message}", param=field) from None
    except ImportError as error:  # the structured extra is not installed
        raise APIError(f"{field}: {error}", 501, param=field) from None
