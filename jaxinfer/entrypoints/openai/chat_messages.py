"""A chat choice's text as its assistant message, whole or streamed: reasoning apart (with
`--reasoning-parser`, reasoning.py) and tool calls parsed from the content part alone (tool_calls.py);
under openai_gptoss with tool_choice "auto", the calls are the reply's harmony function calls instead. A stream
sends the calls as they are written and the content around them as it comes (tool_stream.py)."""

from __future__ import annotations

import dataclasses

from jaxinfer.entrypoints.openai.harmony import HarmonyCall, HarmonyState, harmony_calls
from jaxinfer.entrypoints.openai.reasoning import Split, final_content, split_delta, split_text
from jaxinfer.entrypoints.openai.tool_calls import (
    ToolPlan,
    harmony_tool_calls,
    made_calls,
    tool_call_deltas,
    tool_message,
)
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall
from jaxinfer.entrypoints.openai.tool_stream import ToolCallStream


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
    def reads_calls(self) -> bool:
        """A stream reads the content for tool calls as it comes (tool_stream.py)."""
        return self.tools is not None and self.tools.mode != "none" and not self.harmony_calls


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
    """One streamed choice: its text deltas as message deltas, the reasoning and content sent as they come,
    tool calls as they are written."""

    def __init__(self, plan: ReplyPlan):
        self.plan = plan
        self.split = plan.reasoning
        self.text = ""  # the content so far: the last chunk compares the stream with it parsed whole
        self.calls = ToolCallStream(plan.tools) if plan.reads_calls else None

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
        if self.calls is None:
            return ({**delta, "content": content} if content or self.split is None else delta), finish_reason
        self.text += content
        if finish_reason is None:
            content, calls = self.calls.delta(content)
        else:
            whole = self.text if self.split is None else final_content(self.split, self.text)
            message, finish_reason = _content_message(self.plan.tools, whole, finish_reason)
            content, calls = self.calls.finish(message)
        delta = {**delta, **({"content": content} if content else {}), **({"tool_calls": calls} if calls else {})}
        return (delta or None) if finish_reason is None else delta, finish_reason

    def _harmony_delta(self, before: HarmonyState, delta: dict, finish_reason: str | None) -> tuple[dict, str | None]:
        """The delta with the harmony calls' new pieces, sent as they come (vLLM's); the finish reason is
        "tool_calls" when the reply made any (a call cut off by max_tokens was streamed but is not made)."""
        calls = tool_call_deltas([ParsedCall(c.name, c.arguments) for c in before.calls],
                                 [ParsedCall(c.name, c.arguments) for c in self.split.calls])
        delta = {**delta, "tool_calls": calls} if calls else delta
        made = finish_reason is not None and made_calls(self.split.calls, finish_reason)
        return delta, "tool_calls" if made else finish_reason
