"""Reading a reply as it streams: a format's reader is a generator over a `Source` that suspends (`yield`)
whenever it needs more text, and records what it has decided in a `Progress`: content to send, and calls
whose name is known, their arguments (as the whole-reply parser writes them) growing as the text comes.

A reader raises `Malformed` where the text cannot be calls of the request's tools in its format; it never
needs the reply's end (the stream's last chunk comes from the reply parsed whole, tool_stream.py).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Generator, Mapping

from jaxinfer.entrypoints.openai.reasoning import partial_tag

Wait = Generator[None, None, None]  # a reader, or a step of one: suspends until more text comes
JSON_SPACE = " \t\n\r"


class Malformed(ValueError):
    """The text is not calls of the request's tools in the format."""


class Source:
    """The reply's text so far and how far a reader has taken it."""

    def __init__(self) -> None:
        self.text, self.at = "", 0


@dataclasses.dataclass
class Call:
    """A call as read so far: its name, its arguments JSON text decided so far and the id the format writes
    for it (None: the server's own)."""

    name: str
    arguments: str = ""
    id: str | None = None

    def write(self, piece: str) -> None:
        """More of the arguments."""
        self.arguments += piece


@dataclasses.dataclass
class Progress:
    """What a reader has decided: content (trailing space held in `space`, as the whole reply's content is
    cut after it) and the calls, in order."""

    content: str = ""
    space: str = ""
    calls: list[Call] = dataclasses.field(default_factory=list)

    def say(self, text: str) -> None:
        """More content; its trailing space waits for text after it."""
        text = self.space + text
        body = text.rstrip()
        self.content, self.space = self.content + body, text[len(body):]

    def call(self, name: str, tools: Mapping[str, dict], call_id: str | None = None) -> Call:
        """A call of `name` begins, with the format's id for it if it writes one (Malformed unless it names one
        of the request's tools)."""
        if name not in tools:
            raise Malformed(f"{name!r} is not a tool of the request")
        self.calls.append(Call(name, id=call_id))
        return self.calls[-1]


Reader = Callable[[Source, Progress, Mapping[str, dict]], Wait]


def peek(src: Source, size: int = 1) -> Generator[None, None, str]:
    """The next `size` characters, once there (not taken)."""
    while len(src.text) - src.at < size:
        yield
    return src.text[src.at:src.at + size]


def skip_space(src: Source, space: str | None = None) -> Generator[None, None, str]:
    """Takes whitespace (`space`'s characters; None: any) and gives the next other character, not taken."""
    while True:
        rest = src.text[src.at:]
        kept = rest.lstrip() if space is None else rest.lstrip(space)
        src.at += len(rest) - len(kept)
        if kept:
            return kept[0]
        yield


def expect(src: Source, literal: str) -> Generator[None, None, bool]:
    """Takes `literal` when the text goes on with it; False (nothing taken) as soon as it does not."""
    while True:
        seen = src.text[src.at:src.at + len(literal)]
        if not literal.startswith(seen):
            return False
        if len(seen) == len(literal):
            src.at += len(literal)
            return True
        yield


def until(src: Source, markers: tuple[str, ...], check: Callable[[str], None] = lambda text: None
          ) -> Generator[None, None, tuple[str, str]]:
    """(the text before the first of `markers`, that marker), both taken; `check` sees the text so far and
    raises Malformed as soon as it cannot be what comes before a marker."""
    while True:
        found = [(at, m) for m in markers if (at := src.text.find(m, src.at)) >= 0]
        if found:
            at, marker = min(found)
            text = src.text[src.at:at]
            check(text)
            src.at = at + len(marker)
            return text, marker
        check(src.text[src.at:len(src.text) - max(partial_tag(src.text, m) for m in markers)])
        yield


def text_until(src: Source, marker: str, write: Callable[[str], None], trim: str = "") -> Wait:
    """The text up to `marker` (taken), handed to `write` as it comes (a possible marker held back); `trim`:
    a character the format writes on each side of the text, which is not the text's (the end one held
    until the marker tells)."""
    first = sent = scan = src.at
    while True:
        end = src.text.find(marker, scan)
        scan = max(first, len(src.text) - len(marker) + 1)
        stop = end if end >= 0 else max(first, len(src.text) - partial_tag(src.text, marker))
        start = first + (trim != "" and stop > first and src.text[first] == trim)
        cut = stop - (trim != "" and stop > start and src.text[stop - 1] == trim)
        if cut > max(sent, start):
            write(src.text[max(sent, start):cut])
            sent = cut
        if end >= 0:
            src.at = end + len(marker)
            return
        yield


def name_check(tools: Mapping[str, dict]) -> Callable[[str], None]:
    """A check for `until` on a name being written: Malformed once it can be none of the tools' names (space
    after it: it is written out, so it must be one whole)."""
    def check(text: str) -> None:
        name = text.strip()
        written = name != text.lstrip()
        if not any(tool == name if written else tool.startswith(name) for tool in tools):
            raise Malformed(f"{name[:40]!r} is not a tool of the request")
    return check


def content_until(src: Source, out: Progress, *markers: str) -> Wait:
    """Content up to the first of `markers` (taken), said as it comes; a marker cut across deltas is held until
    whole."""
    while not (found := [(at, m) for m in markers if (at := src.text.find(m, src.at)) >= 0]):
        end = max(src.at, len(src.text) - max(partial_tag(src.text, m) for m in markers))
        out.say(src.text[src.at:end])
        src.at = end
        yield
    at, marker = min(found)
    out.say(src.text[src.at:at])
    src.at = at + len(marker)


def content_rest(src: Source, out: Progress) -> Wait:
    """All the rest is content."""
    while True:
        out.say(src.text[src.at:])
        src.at = len(src.text)
        yield

