"""POST /v1/responses' body (OpenAI's Responses API) and its translation into a chat request.

The Responses API is chat with other names: `input` items are messages, function calls and their
outputs; `instructions` a system message; function tools are flat ({"type": "function", "name": ...});
`text.format` is response_format; `reasoning.effort` a chat-template variable (GPT-OSS's template reads
`reasoning_effort`). So a request becomes a ChatCompletionRequest and runs the chat path (template,
sampling, structured output, tools, reasoning parser, harmony); each 400 names the Responses field.
A message's `input_image` parts (`image_url`: a data: or http(s) URL) become chat's `image_url` parts,
which a vision-language model reads as chat does.
Built-in tools (web search, file search, ...) are refused by name: this server runs none.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import model_validator
from pydantic_core import PydanticCustomError

from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.protocol import UNKNOWN_FIELD, ChatCompletionRequest, ChatMessage, StrictBody

ROLES = ("user", "system", "developer", "assistant")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
TEXT_PARTS = ("input_text", "output_text")
IMAGE_PART = "input_image"
FORMATS = ("text", "json_object", "json_schema")
FORMAT_KEYS = {"type", "name", "schema", "strict", "description"}
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
TOOL_CHOICES = ("none", "auto", "required")
# A chat field a 400 may name, and the Responses field the client gave it as.
RESPONSES_NAMES = {
    "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens", "messages": "input",
    "prompt": "input", "response_format.json_schema.schema": "text.format.schema", "response_format": "text.format",
    "chat_template_kwargs": "reasoning.effort",
}

NOT_IMPLEMENTED = {  # Responses fields OpenAI defines, with what their 400 says is missing
    "conversation": "conversations are not implemented; chain responses with previous_response_id",
    "prompt": "stored prompt templates are not implemented; give input and instructions",
    "top_logprobs": "logprobs are not implemented on /v1/responses; /v1/chat/completions returns them",
    "max_tool_calls": "it bounds built-in tool calls, and this server runs none",
    "service_tier": "service tiers are not implemented", "stream_options": "stream options are not implemented",
    "prompt_cache_key": "prefix caching needs no key here (shared prefixes are reused by their tokens)",
}


class ReasoningConfig(StrictBody):
    """`reasoning`: effort goes to the chat template; summaries are not written (the reasoning is given whole)."""

    effort: str | None = None
    summary: str | None = None


class TextConfig(StrictBody):
    """`text`: the output's format (plain text, any JSON object, or a JSON schema)."""

    format: dict | None = None


class ResponsesRequest(StrictBody):
    """POST /v1/responses."""

    model: str | None = None
    input: str | list[dict]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool = True
    previous_response_id: str | None = None
    background: bool = False
    include: list[str] | None = None
    truncation: str | None = None
    priority: int = 0  # vLLM's: lower is served first under --scheduling-policy priority

    @model_validator(mode="before")
    @classmethod
    def _not_implemented(cls, data: Any) -> Any:
        """A field OpenAI defines that this server does not implement is a 400 saying what is missing."""
        for name in data if isinstance(data, dict) else ():
            if name in NOT_IMPLEMENTED:
                message = f"{name} is not supported: {NOT_IMPLEMENTED[name]}; leave it out"
                raise PydanticCustomError(UNKNOWN_FIELD, "{message}", {"field": name, "message": message})
        return data


def check_supported(body: ResponsesRequest) -> None:
    """400s for the fields this server accepts only at their plain values, naming the field."""
    if body.background:
        raise APIError("background is not supported: responses run while the request is open; leave it out or "
                       "give false", param="background")
    if body.include:
        raise APIError(f"include is not supported (no extra output data is kept), got {body.include[0]!r:.60}; "
                       "leave it out", param="include")
    if body.truncation not in (None, "disabled"):
        raise APIError(f"truncation must be 'disabled' (an input too long for the context is a 400), got "
                       f"{body.truncation!r:.40}", param="truncation")
    reasoning = body.reasoning or ReasoningConfig()
    if reasoning.effort not in (None, *EFFORTS):
        raise APIError(f"reasoning.effort must be one of {', '.join(EFFORTS)}, got {reasoning.effort!r:.40}",
                       param="reasoning.effort")
    if reasoning.summary not in (None, "auto"):
        raise APIError(f"reasoning.summary {reasoning.summary!r:.40} is not supported: no summaries are written "
                       "(reasoning items hold the whole reasoning text); accepted: auto, or leave it out",
                       param="reasoning.summary")


def chat_request(body: ResponsesRequest, turn: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat request that runs `body`: instructions as a system message, then `turn` (the earlier turns
    of a previous_response_id, and the input's messages)."""
    system = [ChatMessage(role="system", content=body.instructions)] if body.instructions is not None else []
    messages = [*system, *turn]
    if not turn:
        raise APIError("input is empty; give a string or at least one message item", param="input")
    tools = chat_tools(body.tools)
    effort = body.reasoning.effort if body.reasoning is not None else None
    return ChatCompletionRequest(
        model=body.model, messages=messages, max_completion_tokens=body.max_output_tokens,
        temperature=body.temperature, top_p=body.top_p, tools=tools,
        tool_choice=chat_tool_choice(body.tool_choice, tools), parallel_tool_calls=body.parallel_tool_calls,
        response_format=response_format(body.text.format if body.text is not None else None),
        chat_template_kwargs=None if effort is None else {"reasoning_effort": effort}, stream=body.stream,
        user=body.user,
    )


def input_messages(value: str | list[dict]) -> list[ChatMessage]:
    """Chat messages of `input`: a string is one user message; items are messages, function calls (an
    assistant's tool_calls, joined to the assistant message before them) and their outputs (tool messages).
    Reasoning items are dropped, as chat templates drop an earlier turn's reasoning."""
    if isinstance(value, str):
        return [ChatMessage(role="user", content=value)]
    messages: list[ChatMessage] = []
    names: dict[str, str] = {}  # call_id -> function name, for the tool message answering it
    for i, item in enumerate(value):
        field = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, field))
        elif kind == "function_call":
            call = _function_call(item, field)
            names[call["id"]] = call["function"]["name"]
            messages = _with_call(messages, call)
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", field)
            output = _text(item.get("output"), f"{field}.output")
            messages.append(ChatMessage(role="tool", content=output, tool_call_id=call_id, name=names.get(call_id)))
        elif kind != "reasoning":
            raise APIError(f"{field}.type {kind!r:.40} is not supported; accepted: {', '.join(ITEM_TYPES)}",
                           param=f"{field}.type")
    return messages


def _message(item: dict, field: str) -> ChatMessage:
    role = item.get("role")
    if role not in ROLES:
        raise APIError(f"{field}.role must be one of {', '.join(ROLES)}, got {role!r:.40}", param=f"{field}.role")
    return ChatMessage(role=role, content=_content(item.get("content"), f"{field}.content"))


def _content(content: Any, field: str) -> str | list[dict]:
    """A message's text, or where it has input_image parts chat's text and image_url parts, in order."""
    if not isinstance(content, list) or not any(_is_image(part) for part in content):
        return _text(content, field)
    parts = []
    for j, part in enumerate(content):
        if not _is_image(part):
            parts.append({"type": "text", "text": _text_part(part, f"{field}[{j}]")})
            continue
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise APIError(f"{field}[{j}].image_url must be the image's URL (data: or http(s)); file_id is not "
                           f"supported, got {url!r:.60}", param=f"{field}[{j}].image_url")
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == IMAGE_PART


def _text(content: Any, field: str) -> str:
    """A content string, or its input_text/output_text parts joined; other parts are refused by name."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{field} must be a string or a list of input_text parts, got {content!r:.60}", param=field)
    return "".join(_text_part(part, f"{field}[{j}]") for j, part in enumerate(content))


def _text_part(part: Any, field: str) -> str:
    """An input_text/output_text part's text; other parts are refused by name."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
        raise APIError(f"{field}: only text and image parts ({', '.join(TEXT_PARTS)}, {IMAGE_PART}) are supported, "
                       f"got {part!r:.80}", param=field)
    return part["text"]


def _string(item: dict, key: str, field: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise APIError(f"{field}.{key} must be a non-empty string, got {value!r:.60}", param=f"{field}.{key}")
    return value


def _function_call(item: dict, field: str) -> dict:
    """A function_call item as a chat tool call (its call_id the call's id)."""
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise APIError(f"{field}.arguments must be the arguments as a JSON string, got {arguments!r:.60}",
                       param=f"{field}.arguments")
    function = {"name": _string(item, "name", field), "arguments": arguments}
    return {"id": _string(item, "call_id", field), "type": "function", "function": function}


def _with_call(messages: list[ChatMessage], call: dict) -> list[ChatMessage]:
    """The messages with `call` made by the last assistant message (a new one when the last is another role)."""
    if messages and messages[-1].role == "assistant":
        last = messages[-1]
        return [*messages[:-1], last.model_copy(update={"tool_calls": [*(last.tool_calls or []), call]})]
    return [*messages, ChatMessage(role="assistant", content=None, tool_calls=[call])]


def chat_tools(tools: list[dict] | None) -> list[dict] | None:
    """Function tools in chat's shape; any other tool type is refused by name."""
    if tools is None:
        return None
    converted = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise APIError(f"tools[{i}].type {kind!r:.40} is not supported: this server runs no built-in tools; "
                           "accepted: function", param=f"tools[{i}].type")
        name = _string(tool, "name", f"tools[{i}]")
        function = {"name": name, "parameters": tool.get("parameters") or {"type": "object"}}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return converted


def chat_tool_choice(choice: str | dict | None, tools: list[dict] | None) -> str | dict | None:
    """tool_choice in chat's shape: an option as it is, {"type": "function", "name": NAME} nested."""
    if choice is None or isinstance(choice, str):
        return choice  # a bad option is chat's 400, which names tool_choice and the options
    names = [tool["function"]["name"] for tool in tools or []]
    if choice.get("type") != "function" or choice.get("name") not in names:
        raise APIError(f'tool_choice must be one of {", ".join(TOOL_CHOICES)} or {{"type": "function", "name": <one '
                       f'of the tools: {", ".join(names) or "none given"}>}}, got {choice!r:.100}', param="tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def response_format(fmt: dict | None) -> dict | None:
    """`text.format` as chat's response_format."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind not in FORMATS:
        raise APIError(f"text.format.type must be one of {', '.join(FORMATS)}, got {kind!r:.40}",
                       param="text.format.type")
    unknown = sorted(set(fmt) - FORMAT_KEYS) if kind == "json_schema" else sorted(set(fmt) - {"type"})
    if unknown:
        raise APIError(f"text.format: unknown key {unknown[0]!r:.40} for type {kind}",
                       param=f"text.format.{unknown[0]}")
    if kind != "json_schema":
        return {"type": kind}
    if not isinstance(fmt.get("schema"), dict):
        raise APIError(f"text.format.schema must be a JSON schema object, got {fmt.get('schema')!r:.60}",
                       param="text.format.schema")
    return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "output"), "schema": fmt["schema"]}}


def responses_error(error: APIError) -> APIError:
    """The chat path's 400 with the field named as the Responses API names it, in its param and its message."""
    new = RESPONSES_NAMES.get(error.param or "")
    message = error.message if new is None else re.sub(rf"\b{re.escape(error.param)}\b", new, error.message, count=1)
    message = re.sub(r"\bmax_(completion_)?tokens\b", "max_output_tokens", message)
    return APIError(message.replace("response_format", "text.format"), error.status, new or error.param, error.kind,
                    error.headers)
