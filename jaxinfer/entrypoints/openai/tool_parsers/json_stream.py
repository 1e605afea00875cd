"""One JSON value read as it streams, written out in pieces as `json.dumps(json.loads(text))` writes it
(", " and ": " separators, ASCII escapes, numbers as Python reads them), so the pieces joined are the
whole-reply parser's arguments text exactly. A string's text goes out as it comes; a number or literal
once it ends. Text that is not JSON raises Malformed where it stops being JSON."""

from __future__ import annotations

import json
import re
from typing import Callable, Generator

from jaxinfer.entrypoints.openai.tool_parsers.incremental import JSON_SPACE, Malformed, Source, Wait, peek, skip_space

Emit = Callable[[str], None]
PLAIN = re.compile(r'[^"\\\x00-\x1f]+')  # string text that needs no decoding
BARE = re.compile(r"[\w.+-]+")  # a number or literal so far
NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")  # Python's json reads the last three too
ESCAPE = re.compile(r'\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})')


def value(src: Source, emit: Emit) -> Wait:
    """One value from the next non-space character; returns once it ended (the text after it not taken)."""
    first = yield from skip_space(src, JSON_SPACE)
    if first == "{":
        yield from _container(src, emit, "{", "}")
    elif first == "[":
        yield from _container(src, emit, "[", "]")
    elif first == '"':
        yield from string(src, emit)
    else:
        yield from _bare(src, emit)


def captured(src: Source) -> Generator[None, None, object]:
    """The next value as Python reads it (a key, a name): held whole."""
    pieces: list[str] = []
    yield from value(src, pieces.append)
    return json.loads("".join(pieces))


def string(src: Source, emit: Emit) -> Wait:
    """A string from its opening quote: its text written out as it comes (an escape once whole)."""
    src.at += 1
    emit('"')
    while True:
        char = yield from peek(src)
        if char == '"':
            src.at += 1
            emit('"')
            return
        if char == "\\":
            head = yield from peek(src, 2)
            escape = (yield from peek(src, 6)) if head == "\\u" else head
            if not ESCAPE.fullmatch(escape):
                raise Malformed(f"bad escape {escape!r} in a JSON string")
            src.at += len(escape)
            emit(json.dumps(json.loads(f'"{escape}"'))[1:-1])
        elif char < " ":
            raise Malformed("a control character in a JSON string")
        else:
            plain = PLAIN.match(src.text, src.at)
            src.at = plain.end()
            emit(json.dumps(plain.group())[1:-1])


def _container(src: Source, emit: Emit, opening: str, closing: str) -> Wait:
    """An object or array from its opening bracket: members written with ", " (and ": ") between them."""
    src.at += 1
    emit(opening)
    next_char = yield from skip_space(src, JSON_SPACE)
    if next_char == closing:
        src.at += 1
        emit(closing)
        return
    while True:
        if opening == "{":
            if next_char != '"':
                raise Malformed(f"a JSON object key must be a string, got {next_char!r}")
            yield from string(src, emit)
            if (yield from skip_space(src, JSON_SPACE)) != ":":
                raise Malformed("a JSON object key without ':'")
            src.at += 1
            emit(": ")
        yield from value(src, emit)
        after = yield from skip_space(src, JSON_SPACE)
        src.at += 1
        if after == closing:
            emit(closing)
            return
        if after != ",":
            raise Malformed(f"{after!r} where a JSON {'object' if opening == '{' else 'array'} goes on or ends")
        emit(", ")
        next_char = yield from skip_space(src, JSON_SPACE)


def _bare(src: Source, emit: Emit) -> Wait:
    """A number or literal, once a character after it shows it ended."""
    while (end := _bare_end(src)) == len(src.text):
        yield
    token = src.text[src.at:end]
    if token not in LITERALS and not NUMBER.fullmatch(token):
        raise Malformed(f"{token[:20] or src.text[src.at]!r} is not a JSON value")
    src.at = end
    emit(json.dumps(json.loads(token)))


def _bare_end(src: Source) -> int:
    found = BARE.match(src.text, src.at)
    return found.end() if found else src.at
