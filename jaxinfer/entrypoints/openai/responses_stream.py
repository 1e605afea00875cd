"""A streamed Response's events (OpenAI's names and fields, openai/types/responses/), from chat message deltas.

response.created and response.in_progress open the stream. Each output item is opened with
response.output_item.added (and, for text, response.content_part.added), grows by
response.reasoning_text.delta / response.output_text.delta / response.function_call_arguments.delta,
and is closed by the matching .done events and response.output_item.done before the next one opens;
response.completed (response.incomplete when max_output_tokens cut it) ends the stream with the whole
Response. Every event carries the next sequence_number.
"""

from __future__ import annotations

import dataclasses

from jaxinfer.entrypoints.openai.responses_output import (
    call_item,
    finished,
    item_id,
    message_item,
    output_text,
    reasoning_item,
    status_of,
)

TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete"}


@dataclasses.dataclass
class OpenItem:
    """The item being written: its kind ("reasoning", "message", "function_call"), id, index and text so far."""

    kind: str
    ident: str
    index: int
    text: str = ""
    call_id: str = ""
    name: str = ""


class ResponseEvents:
    """The events of one streamed Response, each dict ready to send; `output` holds the closed items."""

    def __init__(self, response: dict):
        self.response = response
        self.sequence = 0
        self.output: list[dict] = []
        self.open: OpenItem | None = None

    def event(self, kind: str, **fields) -> dict:
        """One event with the next sequence number."""
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def start(self) -> list[dict]:
        """response.created and response.in_progress."""
        return [self.event("response.created", response=self.response),
                self.event("response.in_progress", response=self.response)]

    def delta(self, message: dict) -> list[dict]:
        """The events of one chat message delta (reasoning_content, content, tool_calls pieces)."""
        events = []
        if message.get("reasoning_content"):
            events += self._text("reasoning", message["reasoning_content"])
        if message.get("content"):
            events += self._text("message", message["content"])
        for piece in message.get("tool_calls") or ():
            events += self._call(piece)
        return events

    def close(self, finish_reason: str | None) -> list[dict]:
        """The last item's closing events (a reply with no item gets an empty message); `output` is then whole."""
        events = [] if self.output or self.open else self._open("message")
        return [*events, *self._close(status_of(finish_reason))]

    def complete(self, finish_reason: str | None, counts: dict) -> tuple[dict, dict]:
        """(the terminal event, the finished Response) once closed."""
        self.response = finished(self.response, self.output, finish_reason, counts)
        return self.event(TERMINAL[self.response["status"]], response=self.response), self.response

    def _text(self, kind: str, text: str) -> list[dict]:
        events = [] if self.open is not None and self.open.kind == kind else [*self._close(), *self._open(kind)]
        self.open.text += text
        delta = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return [*events, self.event(delta, item_id=self.open.ident, output_index=self.open.index, content_index=0,
                                    delta=text, **extra)]

    def _call(self, piece: dict) -> list[dict]:
        """A tool call's first piece (its id and name) opens a function_call item; later ones add arguments."""
        events = []
        if "id" in piece:
            events = self._close()
            ident, index = item_id("fc"), len(self.output)
            self.open = OpenItem("function_call", ident, index, call_id=piece["id"], name=piece["function"]["name"])
            events.append(self.event("response.output_item.added", output_index=index,
                                     item=call_item(piece["id"], self.open.name, "", "in_progress", ident)))
        arguments = piece["function"].get("arguments") or ""
        if not arguments:
            return events
        self.open.text += arguments
        return [*events, self.event("response.function_call_arguments.delta", item_id=self.open.ident,
                                    output_index=self.open.index, delta=arguments)]

    def _open(self, kind: str) -> list[dict]:
        ident, index = item_id("rs" if kind == "reasoning" else "msg"), len(self.output)
        self.open = OpenItem(kind, ident, index)
        if kind == "reasoning":
            item, part = reasoning_item("", "in_progress", ident), {"type": "reasoning_text", "text": ""}
        else:
            item, part = message_item(None, "in_progress", ident), output_text("")
        return [self.event("response.output_item.added", output_index=index, item=item),
                self.event("response.content_part.added", item_id=ident, output_index=index, content_index=0,
                           part=part)]

    def _close(self, status: str = "completed") -> list[dict]:
        """The open item's .done events; it joins `output`."""
        item, self.open = self.open, None
        if item is None:
            return []
        where = {"item_id": item.ident, "output_index": item.index}
        if item.kind == "function_call":
            done = call_item(item.call_id, item.name, item.text, "completed", item.ident)
            events = [self.event("response.function_call_arguments.done", **where, arguments=item.text)]
        elif item.kind == "reasoning":
            done = reasoning_item(item.text, "completed", item.ident)
            part = {"type": "reasoning_text", "text": item.text}
            events = [self.event("response.reasoning_text.done", **where, content_index=0, text=item.text),
                      self.event("response.content_part.done", **where, content_index=0, part=part)]
        else:
            done = message_item(item.text, status, item.ident)
            events = [self.event("response.output_text.done", **where, content_index=0, text=item.text, logprobs=[]),
                      self.event("response.content_part.done", **where, content_index=0, part=output_text(item.text))]
        self.output.append(done)
        return [*events, self.event("response.output_item.done", output_index=item.index, item=done)]
