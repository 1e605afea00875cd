"""GLM-4.5: `<tool_call>NAME` then `<arg_key>k</arg_key><arg_value>v</arg_value>` pairs, `</tool_call>`; the
values are text, typed by the tool's schema (values.py). Text outside the blocks is content."""

from __future__ import annotations

import re
from typing import Mapping

from jaxinfer.entrypoints.openai.tool_parsers.incremental import (
    Call,
    Malformed,
    Progress,
    Source,
    Wait,
    content_until,
    expect,
    name_check,
    skip_space,
    text_until,
    until,
)
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall
from jaxinfer.entrypoints.openai.tool_parsers.values import (
    argument_key,
    argument_piece,
    arguments_end,
    arguments_json,
    is_text,
    text_writer,
    typed_value,
)

START, END = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def read(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """The blocks' calls and the text outside them; None when a block is not a call of a known tool or is
    left open."""
    calls = []
    for block in BLOCK.findall(text):
        name, marker, pairs = block.partition("<arg_key>")
        name, pairs = name.strip(), marker + pairs
        if name not in tools or PAIR.sub("", pairs).strip():
            return None
        calls.append(ParsedCall(name, arguments_json(name, PAIR.findall(pairs), tools)))
    rest = BLOCK.sub("", text)
    return (calls, rest) if calls and START not in rest else None  # a block left open: not a call


def stream(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
    """Content up to each block, the call's name at its first tag, then each argument: text as it comes,
    another value as it closes (typed then: its type is only known whole) (incremental.py)."""
    while True:
        yield from content_until(src, out, START)
        name, marker = yield from until(src, (KEY, END), name_check(tools))
        call = out.call(name.strip(), tools)
        properties, count = tools[call.name].get("properties") or {}, 0
        while marker == KEY:
            key, _ = yield from until(src, (KEY_END,))
            yield from skip_space(src)
            if not (yield from expect(src, VALUE)):
                raise Malformed(f"{KEY_END} must be followed by {VALUE}")
            yield from _value(src, call, count, key, properties.get(key))
            count += 1
            yield from skip_space(src)
            marker = KEY if (yield from expect(src, KEY)) else END if (yield from expect(src, END)) else ""
        if marker != END:
            raise Malformed(f"a {START} block holds more than arguments")
        call.write(arguments_end(count))


def _value(src: Source, call: Call, count: int, key: str, schema: dict | None) -> Wait:
    """An argument's value up to its end tag: text (its schema allows a string) written as it comes, another
    value once whole, typed by the schema."""
    if not is_text(schema):
        value, _ = yield from until(src, (VALUE_END,))
        call.write(argument_piece(count, key, typed_value(value, schema)))
        return
    call.write(argument_key(count, key) + '"')
    yield from text_until(src, VALUE_END, text_writer(call.write))
    call.write('"')
