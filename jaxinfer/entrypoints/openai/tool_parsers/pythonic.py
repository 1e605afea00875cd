"""Pythonic (Llama 3.2, Llama 4, ToolACE): the whole reply is a Python list of calls with keyword arguments,
`[get_weather(city="Oslo", days=2), get_time(zone="UTC")]`, values Python literals (Llama 4 may wrap it in
`<|python_start|>` ... `<|python_end|>`). Values are read by `ast.literal_eval`, never run."""

from __future__ import annotations

import ast
import json
from typing import Any, Callable, Generator, Mapping

from jaxinfer.entrypoints.openai.tool_parsers.incremental import (
    Call,
    Malformed,
    Progress,
    Source,
    Wait,
    expect,
    name_check,
    peek,
    skip_space,
    until,
)
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
OPENING, CLOSING = "([{", ")]}"
QUOTES = "'\""


def read(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """The calls (no content beside them); None unless the reply is a list of calls of known tools."""
    body = text.strip().removeprefix(PYTHON_START).removesuffix(PYTHON_END).strip()
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = [keyword_call(node, tools) for node in tree.elts]
    return None if None in calls else (calls, "")


def keyword_call(node: ast.expr, tools: Mapping[str, dict], json_names: bool = False) -> ParsedCall | None:
    """One `name(key=value, ...)` of a known tool, its arguments as JSON text; None for anything else
    (json_names: `null`, `true` and `false` read as JSON's)."""
    named = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in tools
    if not named or node.args or any(keyword.arg is None for keyword in node.keywords):
        return None
    try:
        arguments = {keyword.arg: python_literal(keyword.value, json_names) for keyword in node.keywords}
        return ParsedCall(node.func.id, json.dumps(arguments))
    except ValueError:
        return None


def python_literal(node: ast.expr, json_names: bool = False) -> Any:
    """A value's Python literal, made JSON's (tuples as lists); ValueError for what JSON cannot hold
    (json_names: `null`, `true` and `false` read as JSON's)."""
    value = ast.literal_eval(_JsonNames().visit(node) if json_names else node)
    try:
        json.dumps(value)
    except TypeError as err:  # sets, bytes, complex numbers
        raise ValueError(str(err)) from err
    return value


def stream(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
    """The calls as they stream (incremental.py): each call's name at its "(", then its arguments as each
    value ends, written as `read` writes them; nothing may follow the list."""
    yield from skip_space(src)
    yield from expect(src, PYTHON_START)
    if (yield from skip_space(src)) != "[":
        raise Malformed("pythonic calls are a Python list")
    src.at += 1
    while True:
        yield from skip_space(src)
        name, _ = yield from until(src, ("(",), name_check(tools))
        yield from keyword_arguments(src, name.strip(), out, tools)
        closer = yield from skip_space(src)
        src.at += 1
        if closer == "]":
            break
        if closer != ",":
            raise Malformed(f"{closer!r} where a list of calls goes on or ends")
    yield from skip_space(src)
    yield from expect(src, PYTHON_END)
    yield from skip_space(src)
    raise Malformed("text after the calls")


def keyword_arguments(src: Source, name: str, out: Progress, tools: Mapping[str, dict], json_names: bool = False
                      ) -> Wait:
    """`key=value, ...)` after a call's "(": the call goes out once its first keyword (or its ")") tells it
    takes keyword arguments, then the JSON object `read` writes, a key and value at a time."""
    write, separator = None, ""
    while (yield from skip_space(src)) != ")":
        key, _ = yield from until(src, ("=",), _identifier)
        write = write or _opened(out.call(name, tools))
        text = yield from _value_text(src)
        try:
            value = python_literal(ast.parse(text.strip(), mode="eval").body, json_names)
        except (SyntaxError, ValueError) as err:
            raise Malformed(f"argument {key.strip()!r} is not a Python literal") from err
        write(f"{separator}{json.dumps(key.strip())}: {json.dumps(value)}")
        separator = ", "
        if (yield from skip_space(src)) == ",":
            src.at += 1
    src.at += 1
    (write or _opened(out.call(name, tools)))("}")


class _JsonNames(ast.NodeTransformer):
    """`null`, `true` and `false` as the constants JSON means by them (OLMo 3 writes them in its calls)."""

    NAMES = {"null": None, "true": True, "false": False}

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Constant(self.NAMES[node.id]) if node.id in self.NAMES else node


def _opened(call: Call) -> Callable[[str], None]:
    """The call's arguments' writer, the object opened."""
    call.write("{")
    return call.write


def _identifier(text: str) -> None:
    """A keyword being written: Malformed once it cannot be one (a positional argument)."""
    if text.strip() and not text.strip().isidentifier():
        raise Malformed(f"{text.strip()[:40]!r} is not a keyword argument")


def _value_text(src: Source) -> Generator[None, None, str]:
    """The text of one value, up to the "," or ")" that ends it at its own depth (not taken); strings, with
    their escapes and triple quotes, and brackets skipped whole."""
    start, depth = src.at, 0
    while True:
        char = yield from peek(src)
        if char in QUOTES:
            yield from _skip_string(src)
            continue
        if depth == 0 and char in ",)":
            return src.text[start:src.at]
        depth += (char in OPENING) - (char in CLOSING)
        if depth < 0:
            raise Malformed(f"{char!r} closes nothing")
        src.at += 1


def _skip_string(src: Source) -> Wait:
    """A quoted string from its first quote (single or triple), escapes included."""
    quote = src.text[src.at]
    triple = (yield from peek(src, 3)) == quote * 3
    delimiter = quote * 3 if triple else quote
    src.at += len(delimiter)
    while True:
        char = yield from peek(src)
        if char == "\\":
            yield from peek(src, 2)
            src.at += 2
        elif (yield from peek(src, len(delimiter))) == delimiter:
            src.at += len(delimiter)
            return
        else:
            src.at += 1
