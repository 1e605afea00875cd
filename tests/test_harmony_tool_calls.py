"""Harmony function calls as OpenAI tool_calls (openai_gptoss with tools, as vLLM's `openai` tool parser):
a finished choice's message and a streamed one's deltas, by tool_choice, with no server."""

from __future__ import annotations

import json

import pytest

from jaxinfer.entrypoints.openai.chat_messages import ChoiceStream, ReplyPlan, assistant_message
from jaxinfer.entrypoints.openai.harmony import start_harmony
from jaxinfer.entrypoints.openai.tool_calls import plan_tools

TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]
THINK = "<|channel|>analysis<|message|>I need the weather<|end|>"
CALL = '<|start|>assistant<|channel|>commentary to=functions.{} <|constrain|>json<|message|>{{"city":"Paris"}}<|call|>'
REPLY = THINK + CALL.format("get_weather") + CALL.format("unlisted").replace("<|call|>", "")  # stopped on <|call|>


def plan(tool_choice="auto", tools=TOOLS) -> ReplyPlan:
    return ReplyPlan(start_harmony(), plan_tools(tools, tool_choice, None))


def streamed(reply_plan: ReplyPlan, text: str, finish_reason: str, size: int) -> tuple[dict, str | None]:
    """The choice's deltas, `size` characters each, joined as a client joins them: (message, finish reason)."""
    stream, message, reason = ChoiceStream(reply_plan), {"reasoning_content": "", "content": "", "tool_calls": []}, None
    for at in range(0, len(text), size):
        delta, reason = stream.delta(text[at:at + size], finish_reason if at + size >= len(text) else None)
        message["reasoning_content"] += (delta or {}).get("reasoning_content") or ""
        message["content"] += (delta or {}).get("content") or ""
        for piece in (delta or {}).get("tool_calls", []):
            if piece["index"] == len(message["tool_calls"]):
                message["tool_calls"].append({**piece, "function": dict(piece["function"])})
            else:
                message["tool_calls"][piece["index"]]["function"]["arguments"] += piece["function"]["arguments"]
    return message, reason


def named_calls(message: dict) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]


def test_auto_returns_each_call_as_written_with_its_reasoning_whole_and_streamed():
    message, reason = assistant_message(plan(), REPLY, "stop")
    expected = [("get_weather", '{"city":"Paris"}'), ("unlisted", '{"city":"Paris"}')]  # unlisted: vLLM's too
    assert named_calls(message) == expected and reason == "tool_calls"
    assert message["content"] is None and message["reasoning_content"] == "I need the weather"
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in message["tool_calls"])
    assert len({c["id"] for c in message["tool_calls"]}) == 2 and json.loads(expected[0][1]) == {"city": "Paris"}
    for size in (1, 5, len(REPLY)):
        joined, reason = streamed(plan(), REPLY, "stop", size)
        assert named_calls(joined) == expected and reason == "tool_calls", size
        assert joined["reasoning_content"] == "I need the weather" and joined["content"] == ""


@pytest.mark.parametrize("tool_choice, tools", [("none", TOOLS), (None, None)])
def test_none_or_no_tools_leaves_the_calls_out(tool_choice, tools):
    message, reason = assistant_message(plan(tool_choice, tools), REPLY, "stop")
    assert "tool_calls" not in message and reason == "stop" and message["content"] is None
    joined, reason = streamed(plan(tool_choice, tools), REPLY, "stop", 3)
    assert joined["tool_calls"] == [] and reason == "stop"


def test_a_reply_without_calls_is_as_before_and_streams_its_content_as_it_comes():
    reply = THINK + "<|start|>assistant<|channel|>final<|message|>Sunny.<|return|>"
    message, reason = assistant_message(plan(), reply, "stop")
    assert (message["content"], reason, "tool_calls" in message) == ("Sunny.", "stop", False)
    stream = ChoiceStream(plan())
    assert stream.delta(reply[:-12], None)[0]["content"] == "Sunn"  # not held for a tool-call parser
    assert streamed(plan(), reply, "stop", 4) == ({"reasoning_content": "I need the weather", "content": "Sunny.",
                                                   "tool_calls": []}, "stop")


def test_a_call_cut_off_by_max_tokens_is_not_made():
    cut = THINK + CALL.format("get_weather")[:-20]
    message, reason = assistant_message(plan(), cut, "length")
    assert "tool_calls" not in message and reason == "length"
    assert streamed(plan(), cut, "length", 4)[1] == "length"  # its pieces went out, as vLLM's do
