"""A streamed chat choice's tool calls sent as they are written, as vLLM streams them: a call's first
`delta.tool_calls` piece gives its index, id, type and name, later ones more of its `function.arguments`;
the content before (and between) the calls goes out as it comes.

The content is read as it streams by the format's reader (tool_parsers/incremental.py): the
`--tool-call-parser` format's for tool_choice "auto", the JSON list of calls for "required", the output
itself as the arguments for a named function. Text that only may begin a call is held until that is
decided: a call goes out once its name is written and is one of the request's tools, and text that turns
out not to be calls (before any went out) is content, as the whole reply then is. The last chunk sends what
the reply parsed whole (tool_calls.py) has that the stream did not, so for a reply of well-formed calls the
chunks joined are the non-streamed message. A reply that goes wrong after a call went out (cut off by
max_tokens, a later call malformed) has sent that much: it ends with the finish reason the whole reply
gets ("length", or "stop" when it holds no calls after all) and nothing more, as harmony's calls do.
"""

from __future__ import annotations

from typing import Mapping

from jaxinfer.entrypoints.openai.tool_calls import ToolPlan, tool_call_deltas
from jaxinfer.entrypoints.openai.tool_parsers.incremental import Malformed, Progress, Reader, Source, Wait
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall, stream_json_calls


class ToolCallStream:
    """One choice's content read for tool calls as it streams; what was sent, to send only what is new."""

    def __init__(self, plan: ToolPlan) -> None:
        self.source, self.progress = Source(), Progress()
        self.reader = _reader(plan)(self.source, self.progress, plan.parameters)
        self.reading = True
        self.plain = False  # not calls: all the text is content
        self.content, self.calls = "", []  # sent

    def delta(self, text: str) -> tuple[str, list[dict]]:
        """(content, tool_calls pieces) of one content delta before the choice's last."""
        self.source.text += text
        if self.reading:
            try:
                next(self.reader)
            except StopIteration:
                self.reading = False
            except Malformed:
                self.reading, self.plain = False, not self.progress.calls
        if self.plain:
            return self._send(self.source.text, [])
        return self._send(self.progress.content, [ParsedCall(c.name, c.arguments, c.id) for c in self.progress.calls])

    def finish(self, message: dict) -> tuple[str, list[dict]]:
        """(content, tool_calls pieces) of the last delta: what the finished message has that was not sent;
        nothing once calls went out that the message does not make."""
        calls = [ParsedCall(call["function"]["name"], call["function"]["arguments"], call["id"])
                 for call in message.get("tool_calls", [])]
        if self.calls and not calls:
            return "", []
        return self._send(message["content"] or "", calls)

    def _send(self, content: str, calls: list[ParsedCall]) -> tuple[str, list[dict]]:
        """The pieces that take what was sent to `content` and `calls` (what does not extend it is not sent)."""
        piece = content[len(self.content):] if content.startswith(self.content) else ""
        self.content += piece
        deltas = tool_call_deltas(self.calls, calls)
        for delta in deltas:
            index, function = delta["index"], delta["function"]
            if index < len(self.calls):
                sent = self.calls[index]
                self.calls[index] = sent._replace(arguments=sent.arguments + function["arguments"])
            else:
                self.calls.append(ParsedCall(function["name"], function["arguments"], delta["id"]))
        return piece, deltas


def _reader(plan: ToolPlan) -> Reader:
    """How the plan's output is read: its parser's format for "auto", a JSON list of calls for "required",
    the arguments themselves for a named function."""
    if plan.mode == "named":
        return _arguments_of(plan.named)
    if plan.mode == "required":
        return stream_json_calls
    return plan.parser.stream or _hold


def _arguments_of(name: str) -> Reader:
    """A named function's output: its arguments, sent as they come (the call's name first)."""
    def read(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
        call = out.call(name, tools)
        while True:
            call.write(src.text[src.at:])
            src.at = len(src.text)
            yield
    return read


def _hold(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
    """A format read only whole: the content is held until the reply ends."""
    yield from ()
