"""Qwen3-Coder: `<tool_call>\\n<function=NAME>\\n<parameter=k>\\nv\\n</parameter>\\n</function>\\n</tool_call>`;
the values are text (one newline each side is the format's), typed by the tool's schema (values.py). Seed-OSS
writes the same between `<seed:tool_call>` and `</seed:tool_call>`."""

from __future__ import annotations

import functools
import re
from typing import Callable, Mapping

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

START, END, FUNCTION, FUNCTION_END = "<tool_call>", "</tool_call>", "<function=", "</function>"
PARAMETER_START, PARAMETER_END = "<parameter=", "</parameter>"
PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.S)


@functools.cache
def block_pattern(start: str, end: str) -> re.Pattern:
    """A call block between the markers: its name and its parameters the groups."""
    return re.compile(rf"{re.escape(start)}\s*<function=([^>\n]*)>(.*?)</function>\s*{re.escape(end)}", re.S)


def read(text: str, tools: Mapping[str, dict], start: str = START, end: str = END
         ) -> tuple[list[ParsedCall], str] | None:
    """The blocks' calls and the text outside them; None when a block is not a call of a known tool or is
    left open."""
    calls, block = [], block_pattern(start, end)
    for name, body in block.findall(text):
        name = name.strip()
        if name not in tools or PARAMETER.sub("", body).strip():
            return None
        pairs = [(key.strip(), _value(value)) for key, value in PARAMETER.findall(body)]
        calls.append(ParsedCall(name, arguments_json(name, pairs, tools)))
    rest = block.sub("", text)
    return (calls, rest) if calls and start not in rest else None  # a block left open: not a call


def _value(text: str) -> str:
    """A parameter's text without the newline the format writes on each side."""
    return text.removeprefix("\n").removesuffix("\n")


def stream(src: Source, out: Progress, tools: Mapping[str, dict], start: str = START, end: str = END) -> Wait:
    """Content up to each block, the call's name at its `>`, then each parameter: text as it comes, another
    value as it closes (typed then: its type is only known whole) (incremental.py)."""
    while True:
        yield from content_until(src, out, start)
        yield from skip_space(src)
        if not (yield from expect(src, FUNCTION)):
            raise Malformed(f"{start} must be followed by {FUNCTION}NAME>")
        name, _ = yield from until(src, (">",), _one_line(name_check(tools)))
        call = out.call(name.strip(), tools)
        properties, count = tools[call.name].get("properties") or {}, 0
        while (yield from skip_space(src)) and (yield from expect(src, PARAMETER_START)):
            key, _ = yield from until(src, (">",), _one_line(lambda text: None))
            yield from _parameter(src, call, count, key.strip(), properties.get(key.strip()))
            count += 1
        ended = (yield from expect(src, FUNCTION_END)) and (yield from skip_space(src))
        if not (ended and (yield from expect(src, end))):
            raise Malformed(f"a {start} block holds more than parameters")
        call.write(arguments_end(count))


def _parameter(src: Source, call: Call, count: int, key: str, schema: dict | None) -> Wait:
    """A parameter's value up to its end tag: text (its schema allows a string) written as it comes, another
    value once whole, typed by the schema."""
    if not is_text(schema):
        value, _ = yield from until(src, (PARAMETER_END,))
        call.write(argument_piece(count, key, typed_value(_value(value), schema)))
        return
    call.write(argument_key(count, key) + '"')
    yield from text_until(src, PARAMETER_END, text_writer(call.write), trim="\n")
    call.write('"')


def _one_line(check: Callable[[str], None]) -> Callable[[str], None]:
    """`check`, and Malformed for a newline (a name or key is `[^>\\n]*`)."""
    def checked(text: str) -> None:
        if "\n" in text:
            raise Malformed("a newline in a tag's name")
        check(text)
    return checked
