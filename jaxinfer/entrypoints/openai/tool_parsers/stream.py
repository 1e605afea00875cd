"""A streamed reply's content sent as it comes up to a parser's start marker (a marker cut across deltas,
and the space before it, held back), the rest held until the reply ends and then read as tool calls."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from jaxinfer.entrypoints.openai.reasoning import partial_tag
from jaxinfer.entrypoints.openai.tool_parsers import ToolParser, read_calls
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall


@dataclasses.dataclass(frozen=True)
class ToolStream:
    """held: content not sent yet (trailing space, a possible marker, or all from the marker on); calling: the
    marker came, so the rest is held until the end."""

    held: str = ""
    calling: bool = False


def tool_stream_delta(state: ToolStream, parser: ToolParser, tools: Mapping[str, dict], delta: str,
                      finish_reason: str | None) -> tuple[ToolStream, str, list[ParsedCall]]:
    """(next state, content delta, calls) of one content delta; the calls come with the last ("stop") delta.
    Joined, the content deltas are what parse_calls gives for the whole reply ("" for its None)."""
    text = state.held + delta
    if finish_reason is not None:
        found = read_calls(parser, text, tools) if finish_reason == "stop" else None
        return ToolStream(), (text if found is None else found[0].rstrip()), ([] if found is None else found[1])
    if state.calling or parser.start is None:
        return ToolStream(text, True), "", []
    at = text.find(parser.start)
    cut = at if at >= 0 else len(text) - partial_tag(text, parser.start)
    sent = text[:cut].rstrip()
    return ToolStream(text[len(sent):], at >= 0), sent, []
