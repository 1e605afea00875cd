"""POST /v1/chat/completions: messages through the chat template, then the completions machinery.

With tools, the chosen tool_choice constrains the output and the finished text is returned as
`tool_calls` (tool_calls.py); a stream sends each call as it is written (tool_stream.py). With
`--reasoning-parser`, the reasoning goes apart from the content (chat_messages.py, reasoning.py); under
openai_gptoss with tool_choice "auto", GPT-OSS's harmony function calls are the tool_calls, streamed as
they come.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from jaxinfer.config.beam_search import BeamSearchParams
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine import CompletionOutput, RequestOutput
from jaxinfer.entrypoints import chat_template
from jaxinfer.entrypoints.chat_template import DEFAULT_CHAT_TEMPLATE
from jaxinfer.entrypoints.content_format import resolve_content_format
from jaxinfer.entrypoints.openai.beam_search import beam_or_sampling, generation
from jaxinfer.entrypoints.openai.chat_images import take_images, with_images
from jaxinfer.entrypoints.openai.chat_messages import ChoiceStream, ReplyPlan, assistant_message
from jaxinfer.entrypoints.openai.completions import build_params
from jaxinfer.entrypoints.openai.errors import APIError, error_body
from jaxinfer.entrypoints.openai.formatting import DONE, chat_logprobs, count_usage, sse, usage
from jaxinfer.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from jaxinfer.entrypoints.openai.reasoning import Split, start_split
from jaxinfer.entrypoints.openai.serving import (
    EventStream,
    ServerState,
    collect,
    deadline_after,
    error_event,
    finish_error,
    merge,
    new_id,
)
from jaxinfer.entrypoints.openai.structured_fields import compile_constraint
from jaxinfer.entrypoints.openai.tool_calls import plan_tools

__all__ = ["DEFAULT_CHAT_TEMPLATE", "chat_prompt_ids", "create_chat_completion", "prepare_chat_images", "render_chat"]
MAX_TOP_LOGPROBS = 20


def render_chat(
    tokenizer: Any | None, messages: list[ChatMessage], add_generation_prompt: bool = True,
    tools: list[dict] | None = None, template_kwargs: dict | None = None, continue_final_message: bool = False,
    content_format: str = "string",
) -> str:
    """The conversation as prompt text: the tokenizer's chat template, else DEFAULT_CHAT_TEMPLATE;
    template_kwargs (`chat_template_kwargs`) are more variables for the template; contents as text or, in the
    "openai" content_format, typed parts."""
    if tokenizer is None:
        raise APIError("this model has no tokenizer, so chat is not available; use /v1/completions with token ids")
    try:
        chat_template.check_template_kwargs(tokenizer, template_kwargs)
    except ValueError as error:
        raise APIError(str(error), param="chat_template_kwargs") from None
    try:
        chat_template.check_continuation(add_generation_prompt, continue_final_message)
    except ValueError as error:
        raise APIError(str(error), param="continue_final_message") from None
    try:
        conversation = [template_message(m, content_format) for m in messages]
        return chat_template.render_chat(tokenizer, conversation, add_generation_prompt, tools=tools,
                                         template_kwargs=template_kwargs,
                                         continue_final_message=continue_final_message)
    except ValueError as error:  # a non-text content part, or a template that rejects the messages
        raise APIError(str(error), param="messages") from None


def template_message(message: ChatMessage, content_format: str) -> dict[str, Any]:
    """A message as the template reads it: its content as text or typed parts, and its tool fields."""
    content = chat_template.message_content(message.content, "messages content", content_format)
    return {"role": message.role, "content": content,
            **message.model_dump(include={"name", "tool_calls", "tool_call_id"}, exclude_none=True)}


def chat_prompt_ids(
    state: ServerState, messages: list[ChatMessage], add_generation_prompt: bool = True,
    tools: list[dict] | None = None, template_kwargs: dict | None = None, continue_final_message: bool = False,
    content_format: str = "string",
) -> list[int]:
    """Token ids of the rendered conversation (the template writes any BOS itself)."""
    text = render_chat(state.tokenizer, messages, add_generation_prompt, tools, template_kwargs,
                       continue_final_message, content_format)
    return chat_template.chat_prompt_ids(state.tokenizer, text)


def _top_logprobs(body: ChatCompletionRequest) -> int | None:
    """How many alternatives per token the engine must return (None: no logprobs)."""
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= MAX_TOP_LOGPROBS:
        raise APIError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {body.top_logprobs}", param="top_logprobs")
    if body.top_logprobs and not body.logprobs:
        raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
    return (body.top_logprobs or 0) if body.logprobs else None


async def create_chat_completion(body: ChatCompletionRequest, state: ServerState, request: Request):
    """Render, check and run one conversation; stream chunks or return the finished message."""
    adapter = state.check_model(body.model)
    priority = state.priority(body.priority)
    timeout = state.timeout(body.timeout)
    deadline = deadline_after(timeout)  # counted from arrival: rendering and queueing are part of it
    # tokenizing, reading images and compiling off the loop
    ids, images, params, plan = await asyncio.to_thread(prepare_chat_images, state, body)
    state.start(request, body.n)
    response_id = new_id("chatcmpl")
    stream = generation(state, ids, params, response_id, deadline, body.stream, adapter, images, priority)
    model = adapter.lora_name if adapter else state.model_name
    header = {"id": response_id, "created": int(time.time()), "model": model}
    if body.stream:
        chunk_header = {**header, "object": "chat.completion.chunk"}
        events = _stream(state, body, chunk_header, merge([stream]), len(ids), timeout, plan)
        return EventStream(events)
    (output,) = await collect([stream], request, timeout)
    finish_error(output)
    choices = [_choice(state, body, out, plan) for out in output.outputs]
    return JSONResponse({**header, "object": "chat.completion", "choices": choices, "usage": count_usage([output])})


def prepare_chat_images(state: ServerState, body: ChatCompletionRequest
                        ) -> tuple[list[int], tuple, SamplingParams | BeamSearchParams, ReplyPlan]:
    """The conversation's token ids, the images of its image_url parts over their placeholders in them,
    checked SamplingParams (4xx errors name the field) and how its choices become messages (POST
    /v1/responses runs its requests through this too)."""
    state.limits.check(body)
    tools = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls, state.tool_parser)
    content_format = chat_content_format(state)
    messages, images = take_images(state, body.messages, content_format == "openai")
    ids = chat_prompt_ids(state, messages, body.add_generation_prompt, body.tools, body.chat_template_kwargs,
                          body.continue_final_message, content_format)
    ids, images = with_images(state, ids, images)
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    params = beam_or_sampling(body, build_params(state, body, ids, None, _top_logprobs(body), requested))
    constraint = None if tools is None else tools.constraint  # tools are refused with beam search
    if constraint is not None:
        if params.structured_outputs is not None:
            raise APIError(f"tool_choice {tools.mode!r} constrains the output, and so does response_format (or a "
                           "guided field); give one of them", param="tool_choice")
        compile_constraint(state, constraint, "tools")
        params = dataclasses.replace(params, structured_outputs=constraint)
    if state.reasoning_parser is not None and state.reasoning_parser.keeps_special:
        params = _keep_special_tokens(params, state.reasoning_parser.name)
    elif tools is not None and tools.mode == "auto" and tools.parser.keeps_special:  # its marker is a special token
        params = dataclasses.replace(params, skip_special_tokens=False)
    return ids, images, params, ReplyPlan(_reasoning_start(state, body, params), tools)


def chat_content_format(state: ServerState) -> str:
    """"string" or "openai": --chat-template-content-format, with "auto" the served template's own."""
    if state.tokenizer is None:  # render_chat refuses the chat
        return "string"
    return resolve_content_format(state.content_format, chat_template.chat_template_of(state.tokenizer))


def _keep_special_tokens(params: SamplingParams | BeamSearchParams, parser: str) -> SamplingParams:
    """The params with special tokens kept in the text: harmony's markers (openai_gptoss), Magistral's [THINK]."""
    if isinstance(params, BeamSearchParams):  # its beams are decoded without special tokens
        raise APIError(f"use_beam_search is not supported with --reasoning-parser {parser}",
                       param="use_beam_search")
    return dataclasses.replace(params, skip_special_tokens=False)


def _reasoning_start(state: ServerState, body: ChatCompletionRequest,
                     params: SamplingParams | BeamSearchParams) -> Split | None:
    """Where each choice's reasoning split starts (None without --reasoning-parser).

    A constrained output, or one whose request turned thinking off, begins as the constraint or the
    answer does, not inside a reasoning the prompt opened: it is reasoning only where it writes `<think>`.
    """
    if state.reasoning_parser is None:
        return None
    constrained = getattr(params, "structured_outputs", None) is not None
    thinking = state.reasoning_parser.thinking(body.chat_template_kwargs)
    return start_split(state.reasoning_parser, implicit=not constrained, thinking=thinking)


def _logprobs(state: ServerState, body: ChatCompletionRequest, out: CompletionOutput) -> dict | None:
    if not body.logprobs or out.logprobs is None:
        return None
    return chat_logprobs(out.token_ids, out.logprobs, body.top_logprobs or 0, state.tokens_as_ids)


def _role(state: ServerState, body: ChatCompletionRequest) -> str:
    """The reply's role, as vLLM names it: --response-role for a new turn, else the continued message's."""
    return state.response_role if body.add_generation_prompt else body.messages[-1].role


def _choice(state: ServerState, body: ChatCompletionRequest, out: CompletionOutput, plan: ReplyPlan) -> dict:
    message, finish_reason = assistant_message(plan, out.text, out.finish_reason)
    return {
        "index": out.index, "message": {**message, "role": _role(state, body)},
        "logprobs": _logprobs(state, body, out), "finish_reason": finish_reason, "stop_reason": out.stop_reason,
    }


async def _stream(state: ServerState, body: ChatCompletionRequest, header: dict,
                  deltas: AsyncIterator[tuple[int, RequestOutput]], prompt_tokens: int,
                  timeout: float | None, plan: ReplyPlan) -> AsyncIterator[str]:
    """A role chunk per choice, content chunks as tokens arrive, an optional usage chunk, then [DONE];
    a generation that raises (a timeout, a shutdown) ends with an error event instead of the usage.

    With a reasoning parser, reasoning chunks come before the content's. With tools to call, each call
    goes out as it is written, its name first and then its arguments in pieces, the content around it as
    it comes (tool_stream.py); harmony calls' pieces likewise.
    """
    generated, replies = 0, [ChoiceStream(plan) for _ in range(body.n)]
    for index in range(body.n):
        choice = {"index": index, "delta": {"role": _role(state, body), "content": ""}, "logprobs": None,
                  "finish_reason": None}
        yield sse({**header, "choices": [choice]})
    finished = set()
    try:
        async for _, delta in deltas:
            if delta.error:
                yield sse(error_body(f"generation failed: {delta.error}", "internal_server_error", None, 500))
                continue
            for out in delta.outputs:
                if out.token_ids or out.text or (out.finish_reason and out.index not in finished):  # each finish once
                    if out.finish_reason:
                        finished.add(out.index)
                    generated += len(out.token_ids)
                    message, reason = replies[out.index].delta(out.text, out.finish_reason)
                    logprobs = _logprobs(state, body, out)
                    if message is None or not (message or reason or logprobs):  # held back: a tag may be starting
                        continue
                    choice = {"index": out.index, "delta": message, "logprobs": logprobs, "finish_reason": reason}
                    yield sse({**header, "choices": [choice]})
        if body.include_usage():
            yield sse({**header, "choices": [], "usage": usage(prompt_tokens, generated)})
    except Exception as error:  # the status line went out already: the error is the stream's last event
        yield sse(error_event(error, timeout))
    finally:
        await deltas.aclose()  # a client gone mid-stream: abort the request and free its pages
    yield DONE
