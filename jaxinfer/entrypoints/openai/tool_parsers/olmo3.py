"""OLMo 3: the whole reply is pythonic calls one a line, `get_weather(city="Oslo", days=2)`, optionally inside
`<function_calls>` ... `</function_calls>`; values are Python literals or JSON's `null`, `true` and `false`
(pythonic.py reads them, never runs them)."""

from __future__ import annotations

import ast
from typing import Mapping

from jaxinfer.entrypoints.openai.tool_parsers.incremental import (
    Malformed,
    Progress,
    Source,
    Wait,
    expect,
    name_check,
    skip_space,
    until,
)
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall
from jaxinfer.entrypoints.openai.tool_parsers.pythonic import keyword_arguments, keyword_call

START, END = "<function_calls>", "</function_calls>"


def read(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """The calls (no content beside them); None unless each line of the reply (inside the tags, if it opens
    with them) is a call of a known tool."""
    body = text.strip()
    if body.startswith(START):
        if not body.endswith(END):
            return None
        body = body[len(START):-len(END)]
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    calls = [_line_call(line, tools) for line in lines]
    return None if not calls or None in calls else (calls, "")


def _line_call(line: str, tools: Mapping[str, dict]) -> ParsedCall | None:
    """One line's call; None unless it is one call of a known tool."""
    try:
        node = ast.parse(line, mode="eval").body
    except SyntaxError:
        return None
    return keyword_call(node, tools, json_names=True)


def stream(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
    """The calls as they stream (incremental.py), as pythonic.py streams them: a newline after each; nothing
    may follow them (or the closing tag)."""
    yield from skip_space(src)
    tagged = yield from expect(src, START)
    while not (tagged and (yield from skip_space(src)) and (yield from expect(src, END))):
        yield from skip_space(src)
        name, _ = yield from until(src, ("(",), name_check(tools))
        yield from keyword_arguments(src, name.strip(), out, tools, json_names=True)
        after = yield from skip_space(src, " \t")
        if after != "\n" and not (tagged and after == "<"):
            raise Malformed("calls are one a line")
    yield from skip_space(src)
    raise Malformed("text after the calls")
