"""The Response object of POST /v1/responses, and its output items, from a chat reply.

A finished reply (chat_messages.assistant_message: content, reasoning, tool_calls) becomes OpenAI's
output items: a `reasoning` item (its text as reasoning_text content; no summary is written), a `message`
with one `output_text` part, then a `function_call` item per call. There is a message when the reply has
text, or when nothing else came out. (A stream sends items as they are written, so a harmony reply that
goes back to reasoning after a call has more items there.) A reply cut by
max_output_tokens is status "incomplete" with incomplete_details; the conversation it continues is
kept as chat messages (`conversation`), for a later request's previous_response_id.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from jaxinfer.entrypoints.openai.protocol import ChatMessage
from jaxinfer.entrypoints.openai.responses_protocol import ResponsesRequest


def item_id(prefix: str) -> str:
    """An id like OpenAI's (`resp_...`, `msg_...`, `rs_...`, `fc_...`)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def status_of(finish_reason: str | None) -> str:
    """A finished reply's status: "incomplete" when max_output_tokens (or the context) cut it."""
    return "incomplete" if finish_reason == "length" else "completed"


def reasoning_item(text: str, status: str = "completed", ident: str | None = None) -> dict:
    """A reasoning item holding the reasoning text."""
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"id": ident or item_id("rs"), "type": "reasoning", "summary": [], "content": content, "status": status}


def output_text(text: str) -> dict:
    """One output_text content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(text: str | None, status: str = "completed", ident: str | None = None) -> dict:
    """An assistant message item (no content part before its text starts)."""
    content = [] if text is None else [output_text(text)]
    return {"id": ident or item_id("msg"), "type": "message", "role": "assistant", "status": status, "content": content}


def call_item(call_id: str, name: str, arguments: str, status: str = "completed", ident: str | None = None) -> dict:
    """A function_call item; call_id is what the function_call_output answering it names."""
    return {"id": ident or item_id("fc"), "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output_items(message: dict, finish_reason: str | None) -> list[dict]:
    """A finished reply's output items."""
    status = status_of(finish_reason)
    items = [reasoning_item(message["reasoning_content"])] if message.get("reasoning_content") else []
    calls = [call_item(call["id"], call["function"]["name"], call["function"]["arguments"])
             for call in message.get("tool_calls") or ()]
    if message.get("content") or not (items or calls):
        items.append(message_item(message.get("content") or "", status))
    return [*items, *calls]


def usage(input_tokens: int, output_tokens: int, reasoning_tokens: int) -> dict:
    """Token counts; reasoning_tokens counts the reasoning text's tokens (its markers are not counted);
    cached_tokens is 0: the engine reports no per-request prefix-cache hits (chat's usage has none either)."""
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens}


def response_object(body: ResponsesRequest, ident: str, model: str, params: Any) -> dict:
    """The Response as it starts (status in_progress, no output): the request's settings as they ran."""
    fmt = body.text.format if body.text is not None and body.text.format is not None else {"type": "text"}
    reasoning = body.reasoning.model_dump() if body.reasoning is not None else None
    return {
        "id": ident, "object": "response", "created_at": int(time.time()), "model": model, "status": "in_progress",
        "error": None, "incomplete_details": None, "instructions": body.instructions, "metadata": body.metadata or {},
        "output": [], "parallel_tool_calls": body.parallel_tool_calls is not False, "temperature": params.temperature,
        "top_p": params.top_p, "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
        "max_output_tokens": body.max_output_tokens, "previous_response_id": body.previous_response_id,
        "reasoning": reasoning, "text": {"format": fmt}, "truncation": "disabled", "usage": None, "user": body.user,
        "background": False,
    }


def finished(response: dict, output: list[dict], finish_reason: str | None, counts: dict) -> dict:
    """The Response once its reply ended."""
    status = status_of(finish_reason)
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {**response, "status": status, "incomplete_details": incomplete, "output": output, "usage": counts,
            "completed_at": int(time.time())}


def conversation(messages: list[ChatMessage], output: list[dict]) -> list[ChatMessage]:
    """The conversation a later turn continues: its messages (instructions left out, as OpenAI leaves them
    out of a previous_response_id's turn) and the reply as an assistant message (its reasoning dropped)."""
    text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function", "function": {"name": item["name"],
                                                                      "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]
    return [*messages, ChatMessage(role="assistant", content=text, tool_calls=calls or None)]
