"""A chat choice's text as its assistant message, whole or streamed: reasoning apart (with
`--reasoning-parser`, reasoning.py) and tool calls parsed from the content part alone (tool_calls.py);
under openai_gptoss with tool_choice "auto", the calls are the reply's harmony function calls instead. A stream
whose `--tool-call-parser` has a start marker sends the content up to it as it comes (tool_parsers/stream.py)."""

from __future__ import annotations

import dataclasses

from jaxinfer.entrypoints.openai.harmony import HarmonyCall, HarmonyState, harmony_calls
from jaxinfer.entrypoints.openai.reasoning import Split, final_content, split_delta, split_text
from jaxinfer.entrypoints.openai.tool_calls import (
    ToolPlan,
    harmony_tool_calls,
    made_calls,
    tool_call,
    tool_call_deltas,
    tool_message,
)
from jaxinfer.entrypoints.openai.tool_parsers.stream import ToolStream, tool_stream_delta


@dataclasses.dataclass(frozen=True)
class ReplyPlan:
    """How a request's choices become messages: where the reasoning split starts (None: no parser) and the tools."""

    reasoning: Split | None = None
    tools: ToolPlan | None = None

    @property
    def harmony_calls(self) -> bool:
        """The calls are harmony's function calls (openai_gptoss, tool_choice "auto"), apart from the content."""
        return isinstance(self.reasoning, HarmonyState) and self.tools is not None and self.tools.mode == "auto"

    @property
    def holds_content(self) -> bool:
        """A stream holds the content until the choice ends: tool calls are only known once it is whole."""
        return self.tools is not None and self.tools.mode != "none" and not self.harmony_calls

    @property
    def streams_content(self) -> bool:
        """A stream sends the content before the parser's start marker as it comes ("auto" with a marked format)."""
        return self.holds_content and self.tools.mode == "auto" and self.tools.parser.start is not None


def reasoning_fields(reasoning: str | None) -> dict:
    """The reasoning under vLLM's two names: `reasoning_content` (DeepSeek's, which clients read) and
    `reasoning` (vLLM's since late 2025)."""
    return {"reasoning_content": reasoning, "reasoning": reasoning}


def assistant_message(plan: ReplyPlan, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
    """The message of a finished choice and its finish reason ("tool_calls" when it called any)."""
    if plan.reasoning is None:
        return tool_message(plan.tools, text, finish_reason)
    reasoning, content = split_text(plan.reasoning, text)
    if plan.harmony_calls:
        calls = made_calls(harmony_calls(plan.reasoning, text), finish_reason)
        message, finish_reason = _with_calls({"role": "assistant", "content": content}, calls, finish_reason)
        return {**message, **reasoning_fields(reasoning)}, finish_reason
    message, finish_reason = _content_message(plan.tools, content, finish_reason)
    return {**message, **reasoning_fields(reasoning)}, finish_reason


def _content_message(tools: ToolPlan | None, content: str | None, finish_reason: str | None) -> tuple[dict, str | None]:
    if content is None:  # the output ended inside (or right after) its reasoning: no answer, so no calls
        return {"role": "assistant", "content": None}, finish_reason
    return tool_message(tools, content, finish_reason)


def _with_calls(message: dict, calls: list[HarmonyCall], finish_reason: str | None) -> tuple[dict, str | None]:
    """A message with harmony calls made as its tool_calls (finish reason "tool_calls"), or as it is without."""
    if not calls:
        return message, finish_reason
    return {**message, "tool_calls": harmony_tool_calls(calls)}, "tool_calls"


class ChoiceStream:
    """One streamed choice: its text deltas as message deltas, the reasoning sent as it comes, the content
    too unless tool calls may be in it."""

    def __init__(self, plan: ReplyPlan):
        self.plan = plan
        self.split = plan.reasoning
        self.held = ""  # content held for the tool-call parser
        self.calls = ToolStream()  # the content's progress through a marked tool-call format

    def delta(self, text: str, finish_reason: str | None) -> tuple[dict | None, str | None]:
        """(the chunk's delta, its finish reason) for a text delta; a None delta: nothing to send yet."""
        before = self.split
        if self.split is None:
            reasoning, content = "", text
        else:
            self.split, reasoning, content = split_delta(self.split, text, final=finish_reason is not None)
        delta = reasoning_fields(reasoning) if reasoning else {}
        if self.plan.harmony_calls:
            return self._harmony_delta(before, {**delta, **({"content": content} if content else {})}, finish_reason)
        if not self.plan.holds_content:
            return ({**delta, "content": content} if content or self.split is None else delta), finish_reason
        if self.plan.streams_content:
            return self._marked_delta(delta, content, finish_reason)
        self.held += content
        if finish_reason is None:
            return delta or None, None
        whole = self.held if self.split is None else final_content(self.split, self.held)
        message, finish_reason = _content_message(self.plan.tools, whole, finish_reason)
        return {**delta, **{k: v for k, v in message.items() if k != "role"}}, finish_reason

    def _marked_delta(self, delta: dict, content: str, finish_reason: str | None) -> tuple[dict | None, str | None]:
        """The delta with the content before the start marker, and the calls when the choice ends ("tool_calls")."""
        tools = self.plan.tools
        self.calls, content, calls = tool_stream_delta(self.calls, tools.parser, tools.parameters, content,
                                                       finish_reason)
        delta = {**delta, "content": content} if content else delta
        if calls:
            pieces = [{"index": index, **tool_call(name, arguments)} for index, (name, arguments) in enumerate(calls)]
            return {**delta, "tool_calls": pieces}, "tool_calls"
        return (delta or None) if finish_reason is None else delta, finish_reason

    def _harmony_delta(self, before: HarmonyState, delta: dict, finish_reason: str | None) -> tuple[dict, str | None]:
        """The delta with the harmony calls' new pieces, sent as they come (vLLM's); the finish reason is
        "tool_calls" when the reply made any (a call cut off by max_tokens was streamed but is not made)."""
        calls = tool_call_deltas(before.calls, self.split.calls)
        delta = {**delta, "tool_calls": calls} if calls else delta
        made = finish_reason is not None and made_calls(self.split.calls, finish_reason)
        return delta, "tool_calls" if made else finish_reason
