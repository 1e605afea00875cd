"""MiniMax-M2: `<minimax:tool_call>`, then per call `<invoke name="NAME">` with `<parameter name="k">v</parameter>`
pieces and `</invoke>`, then `</minimax:tool_call>`; several calls may share a block. Names and keys are
double-quoted, as MiniMax's chat template writes them; the values are text, whitespace around them cut (as vLLM
reads them), typed by the tool's schema (values.py). Text outside the blocks is content."""

from __future__ import annotations

import re
from typing import Callable, Mapping, NamedTuple

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

START, END = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE, INVOKE_END, PARAMETER, PARAMETER_END = '<invoke name="', "</invoke>", '<parameter name="', "</parameter>"
NAME_END = '">'


class InvokeTags(NamedTuple):
    """The tags of a call written as an invoke of named parameters (MiniMax-M2's; Step-3's `steptml:` ones)."""

    invoke: str
    invoke_end: str
    parameter: str
    parameter_end: str


MINIMAX = InvokeTags(INVOKE, INVOKE_END, PARAMETER, PARAMETER_END)
BLOCK = re.compile(r"<minimax:tool_call>(.*?)</minimax:tool_call>", re.S)
CALL = re.compile(r'\s*<invoke name="([^"]*)">(.*?)</invoke>', re.S)
PARAMETER_PAIR = re.compile(r'<parameter name="([^"]*)">(.*?)</parameter>', re.S)


def read(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """The blocks' calls and the text outside them; None when a block holds anything but calls of known tools
    or is left open."""
    calls = []
    for block in BLOCK.findall(text):
        at, before = 0, len(calls)
        while found := CALL.match(block, at):
            name, body = found[1].strip(), found[2]
            if name not in tools or PARAMETER_PAIR.sub("", body).strip():
                return None
            pairs = [(key.strip(), value.strip()) for key, value in PARAMETER_PAIR.findall(body)]
            calls.append(ParsedCall(name, arguments_json(name, pairs, tools)))
            at = found.end()
        if len(calls) == before or block[at:].strip():
            return None
    rest = BLOCK.sub("", text)
    return (calls, rest) if calls and START not in rest else None  # a block left open: not a call


def stream(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
    """Content up to each block, then each call: its name at the `">` after it, each parameter's text as it
    comes (its trailing space held until text follows), another value as it closes (typed then)
    (incremental.py)."""
    while True:
        yield from content_until(src, out, START)
        yield from skip_space(src)
        if not (yield from expect(src, INVOKE)):
            raise Malformed(f'{START} must be followed by {INVOKE}NAME">')
        while True:
            yield from invoke(src, out, tools)
            yield from skip_space(src)
            if (yield from expect(src, END)):
                break
            if not (yield from expect(src, INVOKE)):
                raise Malformed(f"a {START} block holds more than calls")


def invoke(src: Source, out: Progress, tools: Mapping[str, dict], tags: InvokeTags = MINIMAX) -> Wait:
    """One call after its `<invoke name="`, up to its `</invoke>` (taken)."""
    name, _ = yield from until(src, (NAME_END,), _unquoted(name_check(tools)))
    call = out.call(name.strip(), tools)
    properties, count = tools[call.name].get("properties") or {}, 0
    while (yield from skip_space(src)) and (yield from expect(src, tags.parameter)):
        key, _ = yield from until(src, (NAME_END,), _unquoted(lambda text: None))
        yield from _parameter(src, call, count, key.strip(), properties.get(key.strip()), tags.parameter_end)
        count += 1
    if not (yield from expect(src, tags.invoke_end)):
        raise Malformed(f"an {tags.invoke} call holds more than parameters")
    call.write(arguments_end(count))


def _parameter(src: Source, call: Call, count: int, key: str, schema: dict | None, end: str) -> Wait:
    """A parameter's value up to its end tag, whitespace around it cut: text (its schema allows a string) written
    as it comes, another value once whole, typed by the schema."""
    if not is_text(schema):
        value, _ = yield from until(src, (end,))
        call.write(argument_piece(count, key, typed_value(value.strip(), schema)))
        return
    call.write(argument_key(count, key) + '"')
    yield from skip_space(src)
    yield from text_until(src, end, _space_held(text_writer(call.write)))
    call.write('"')


def _space_held(write: Callable[[str], None]) -> Callable[[str], None]:
    """`write` with trailing whitespace held until text follows it (never written when the value ends there)."""
    held = ""

    def hold(piece: str) -> None:
        nonlocal held
        text = held + piece
        body = text.rstrip()
        held = text[len(body):]
        if body:
            write(body)

    return hold


def _unquoted(check: Callable[[str], None]) -> Callable[[str], None]:
    """`check`, and Malformed for a quote (a name or key is `[^"]*`)."""
    def checked(text: str) -> None:
        if '"' in text:
            raise Malformed("a quote in a tag's name")
        check(text)
    return checked
