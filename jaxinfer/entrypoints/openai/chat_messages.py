"""A chat choice's text as its assistant message, whole or streamed: reasoning apart (with
`--reasoning-parser`, reasoning.py) and tool calls parsed from the content part alone (tool_calls.py)."""

from __future__ import annotations

import dataclasses

from jaxinfer.entrypoints.openai.reasoning import Split, final_content, split_delta, split_text
from jaxinfer.entrypoints.openai.tool_calls import ToolPlan, tool_message


@dataclasses.dataclass(frozen=True)
class ReplyPlan:
    """How a request's choices become messages: where the reasoning split starts (None: no parser) and the tools."""

    reasoning: Split | None = None
    tools: ToolPlan | None = None

    @property
    def holds_content(self) -> bool:
        """A stream holds the content until the choice ends: tool calls are only known once it is whole."""
        return self.tools is not None and self.tools.mode != "none"


def reasoning_fields(reasoning: str | None) -> dict:
    """The reasoning under vLLM's two names: `reasoning_content` (DeepSeek's, which clients read) and
    `reasoning` (vLLM's since late 2025)."""
    return {"reasoning_content": reasoning, "reasoning": reasoning}


def assistant_message(plan: ReplyPlan, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
    """The message of a finished choice and its finish reason ("tool_calls" when it called any)."""
    if plan.reasoning is None:
        return tool_message(plan.tools, text, finish_reason)
    reasoning, content = split_text(plan.reasoning, text)
    message, finish_reason = _content_message(plan.tools, content, finish_reason)
    return {**message, **reasoning_fields(reasoning)}, finish_reason


def _content_message(tools: ToolPlan | None, content: str | None, finish_reason: str | None) -> tuple[dict, str | None]:
    if content is None:  # the output ended inside (or right after) its reasoning: no answer, so no calls
        return {"role": "assistant", "content": None}, finish_reason
    return tool_message(tools, content, finish_reason)


class ChoiceStream:
    """One streamed choice: its text deltas as message deltas, the reasoning sent as it comes, the content
    too unless tool calls may be in it."""

    def __init__(self, plan: ReplyPlan):
        self.plan = plan
        self.split = plan.reasoning
        self.held = ""  # content held for the tool-call parser

    def delta(self, text: str, finish_reason: str | None) -> tuple[dict | None, str | None]:
        """(the chunk's delta, its finish reason) for a text delta; a None delta: nothing to send yet."""
        if self.split is None:
            reasoning, content = "", text
        else:
            self.split, reasoning, content = split_delta(self.split, text, final=finish_reason is not None)
        delta = reasoning_fields(reasoning) if reasoning else {}
        if not self.plan.holds_content:
            return ({**delta, "content": content} if content or self.split is None else delta), finish_reason
        self.held += content
        if finish_reason is None:
            return delta or None, None
        whole = self.held if self.split is None else final_content(self.split, self.held)
        message, finish_reason = _content_message(self.plan.tools, whole, finish_reason)
        return {**delta, **{k: v for k, v in message.items() if k != "role"}}, finish_reason
