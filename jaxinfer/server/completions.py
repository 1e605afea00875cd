"""POST /v1/completions: prompts (text or ids, one or a batch) to completions, whole or streamed."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from jaxinfer.engine import CompletionOutput, RequestOutput
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.server.errors import APIError, error_body
from jaxinfer.server.formatting import DONE, completion_logprobs, count_usage, sse, usage
from jaxinfer.server.protocol import CompletionRequest, SamplingFields, sampling_params
from jaxinfer.server.serving import ServerState, collect, finish_error, merge, new_id

OPENAI_DEFAULT_MAX_TOKENS = 16  # the completions API's documented default


def prompt_list(prompt: str | list) -> list[str | list[int]]:
    """The request's prompts: one text, one id list, or a batch of either."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError("prompt is empty; give a string, a list of token ids, or a list of either", param="prompt")
    return [prompt] if isinstance(prompt[0], int) else list(prompt)


def build_params(state: ServerState, body: SamplingFields, ids: list[int], default_max: int | None,
                 logprobs: int | None, requested_max: int | None) -> SamplingParams:
    """Checked SamplingParams for one prompt; bad values are 400s that name the field."""
    max_tokens = state.max_tokens(requested_max, len(ids), default_max)
    state.check_length(ids, max_tokens)
    state.check_stop_ids(body.stop_token_ids)
    try:
        return sampling_params(body, state.default_params, max_tokens, logprobs)
    except (ValueError, TypeError) as error:
        field = str(error).split(" ", 1)[0]
        raise APIError(str(error), param=field if field in type(body).model_fields else None) from None


async def create_completion(body: CompletionRequest, state: ServerState, request: Request):
    """Start every prompt of the request; stream chunks or return the finished response."""
    state.check_model(body.model)
    if body.best_of is not None and body.best_of != body.n:
        raise APIError("best_of other than n is not supported", param="best_of")
    prompts, params = await asyncio.to_thread(_prepare, state, body)  # tokenizing is off the event loop
    response_id = new_id("cmpl")
    streams = [state.engine.generate(ids, p, f"{response_id}-{i}") for i, (ids, p) in enumerate(zip(prompts, params))]
    header = {"id": response_id, "object": "text_completion", "created": int(time.time()), "model": state.model_name}
    if body.stream:
        events = _stream(state, body, header, merge(streams), sum(map(len, prompts)))
        return StreamingResponse(events, media_type="text/event-stream")
    outputs = await collect(streams, request)
    for output in outputs:
        finish_error(output)
    choices = [_choice(state, body, i, out) for i, output in enumerate(outputs) for out in output.outputs]
    return JSONResponse({**header, "choices": choices, "usage": count_usage(outputs)})


def _prepare(state: ServerState, body: CompletionRequest) -> tuple[list[list[int]], list[SamplingParams]]:
    """Each prompt's token ids and checked SamplingParams (4xx errors name the field)."""
    prompts = [state.encode(p) for p in prompt_list(body.prompt)]
    params = [build_params(state, body, ids, OPENAI_DEFAULT_MAX_TOKENS, body.logprobs, body.max_tokens) for ids in prompts]
    return prompts, params


def _choice(state: ServerState, body: CompletionRequest, prompt_index: int, out: CompletionOutput,
            offset: int = 0) -> dict:
    logprobs = None
    if body.logprobs is not None and out.logprobs is not None:
        logprobs = completion_logprobs(out.token_ids, out.logprobs, offset)
    return {
        "index": prompt_index * body.n + out.index, "text": out.text, "logprobs": logprobs,
        "finish_reason": out.finish_reason, "stop_reason": out.stop_reason,
    }


async def _stream(state: ServerState, body: CompletionRequest, header: dict,
                  deltas: AsyncIterator[tuple[int, RequestOutput]], prompt_tokens: int) -> AsyncIterator[str]:
    """SSE chunks as tokens arrive, an optional usage chunk, then [DONE]."""
    generated, offsets, finished = 0, {}, set()
    try:
        async for i, delta in deltas:
            if delta.error:
                yield sse(error_body(f"generation failed: {delta.error}", "internal_server_error", None, 500))
                continue
            for out in delta.outputs:
                key = (i, out.index)
                if out.token_ids or out.text or (out.finish_reason and key not in finished):  # each finish once
                    generated += len(out.token_ids)
                    yield sse({**header, "choices": [_choice(state, body, i, out, offsets.get(key, 0))]})
                    offsets[key] = offsets.get(key, 0) + len(out.text)
                    if out.finish_reason:
                        finished.add(key)
        if body.include_usage():
            yield sse({**header, "choices": [], "usage": usage(prompt_tokens, generated)})
    finally:
        await deltas.aclose()  # a client gone mid-stream: abort whatever is still running
    yield DONE
