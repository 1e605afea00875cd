"""POST /v1/completions: prompts (text or ids, one or a batch) to completions, whole or streamed.

`echo` puts the prompt before each completion (with `logprobs`, the prompt's log-probabilities
before the completion's, the first token's None); `max_tokens: 0` with echo scores the prompt
alone, as lm-eval's `local-completions` asks for loglikelihoods.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from jaxinfer.config.beam_search import BeamSearchParams
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine import CompletionOutput, RequestOutput
from jaxinfer.engine.prompt_checks import check_logit_bias
from jaxinfer.entrypoints.openai.beam_search import beam_or_sampling, generation
from jaxinfer.entrypoints.openai.embeds_prompts import embedded_prompts
from jaxinfer.entrypoints.openai.errors import APIError, error_body
from jaxinfer.entrypoints.openai.formatting import DONE, completion_logprobs, count_usage, sse, usage
from jaxinfer.entrypoints.openai.protocol import CompletionRequest, SamplingFields, sampling_params
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
from jaxinfer.entrypoints.openai.structured_fields import compile_constraint, requested_constraint
from jaxinfer.sampling.logprob import Logprob

OPENAI_DEFAULT_MAX_TOKENS = 16  # the completions API's documented default
Logprobs = list[dict[int, Logprob] | None]


@dataclasses.dataclass(frozen=True)
class Echo:
    """What `echo` puts before a prompt's completions: its text, ids and (with logprobs) their logprobs."""

    text: str
    token_ids: list[int]
    only: bool  # max_tokens 0: the prompt alone; the one token the engine generated is dropped


def prompt_list(prompt: str | list | None) -> list[str | list[int]]:
    """The request's prompts: one text, one id list, or a batch of either."""
    if prompt is None:
        raise APIError("prompt is required (or prompt_embeds, with --enable-prompt-embeds)", param="prompt")
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError("prompt is empty; give a string, a list of token ids, or a list of either", param="prompt")
    return [prompt] if isinstance(prompt[0], int) else list(prompt)


def build_params(state: ServerState, body: SamplingFields, ids: list[int], default_max: int | None,
                 logprobs: int | None, requested_max: int | None, prompt_logprobs: int | None = None) -> SamplingParams:
    """Checked SamplingParams for one prompt; bad values are 400s that name the field."""
    if body.truncate_prompt_tokens is not None:  # the engine keeps the same last ids (SamplingParams.kept_prompt)
        if body.truncate_prompt_tokens < 1:
            raise APIError(f"truncate_prompt_tokens must be >= 1 (the prompt's last k tokens), got "
                           f"{body.truncate_prompt_tokens}", param="truncate_prompt_tokens")
        ids = ids[-body.truncate_prompt_tokens:]
    max_tokens = state.max_tokens(requested_max, len(ids), default_max)
    state.check_length(ids, max_tokens)
    state.check_stop_ids(body.stop_token_ids)
    try:
        params = sampling_params(body, state.default_params, max_tokens, logprobs, prompt_logprobs)
        check_logit_bias(params.logit_bias, state.vocab_size)
    except (ValueError, TypeError) as error:
        field = str(error).split(" ", 1)[0]
        raise APIError(str(error), param=field if field in type(body).model_fields else None) from None
    constraint, field = requested_constraint(body)
    if constraint is None:
        return params
    compile_constraint(state, constraint, field)
    return dataclasses.replace(params, structured_outputs=constraint)


def generated_max_tokens(body: CompletionRequest) -> int | None:
    """max_tokens for the engine: 0 (with echo) runs 1, whose token is dropped; without echo it is a 400."""
    if body.max_tokens != 0:
        return body.max_tokens
    if not body.echo:
        raise APIError("max_tokens must be >= 1, got 0; 0 goes with echo: true (the prompt alone, to score it)",
                       param="max_tokens")
    return 1


async def create_completion(body: CompletionRequest, state: ServerState, request: Request):
    """Start every prompt of the request; stream chunks or return the finished response."""
    adapter = state.check_model(body.model)
    priority = state.priority(body.priority)
    if body.best_of is not None and body.best_of != body.n:
        raise APIError("best_of other than n is not supported", param="best_of")
    timeout = state.timeout(body.timeout)
    deadline = deadline_after(timeout)  # counted from arrival: tokenizing and queueing are part of it
    prompts, params, echoes, images = await asyncio.to_thread(_prepare, state, body)  # tokenizing: off the loop
    state.start(request, body.n * len(prompts))
    response_id = new_id("cmpl")
    streams = [generation(state, ids, p, f"{response_id}-{i}", deadline, body.stream, adapter, rows, priority)
               for i, (ids, p, rows) in enumerate(zip(prompts, params, images))]
    model = adapter.lora_name if adapter else state.model_name
    header = {"id": response_id, "object": "text_completion", "created": int(time.time()), "model": model}
    if body.stream:
        events = _stream(state, body, header, merge(streams), sum(map(len, prompts)), echoes, timeout)
        return EventStream(events)
    outputs = await collect(streams, request, timeout)
    for output in outputs:
        finish_error(output)
    choices = [
        _choice(state, body, i, out if echoes is None else echoed(out, echoes[i], output.prompt_logprobs, True))
        for i, output in enumerate(outputs) for out in output.outputs
    ]
    counts = count_usage(outputs)
    if echoes is not None and echoes[0].only:
        counts = usage(counts["prompt_tokens"], 0)
    return JSONResponse({**header, "choices": choices, "usage": counts})


def _echo(state: ServerState, body: CompletionRequest, prompt: str | list[int], ids: list[int]) -> Echo:
    """A text prompt echoes as given; an id prompt as its decoded text."""
    if not isinstance(prompt, str):
        prompt = "" if state.tokenizer is None else state.tokenizer.decode(ids, clean_up_tokenization_spaces=False)
    return Echo(prompt, ids, body.max_tokens == 0)


def echoed(out: CompletionOutput, echo: Echo, prompt_logprobs: Logprobs | None, first: bool) -> CompletionOutput:
    """A choice (or a stream's chunk of one) with the prompt before it when first; the generated
    part dropped when the echo is the prompt alone."""
    if echo.only:
        out = dataclasses.replace(out, text="", token_ids=[], logprobs=None if out.logprobs is None else [])
    if not first:
        return out
    logprobs = None if out.logprobs is None or prompt_logprobs is None else [*prompt_logprobs, *out.logprobs]
    return dataclasses.replace(
        out, text=echo.text + out.text, token_ids=[*echo.token_ids, *out.token_ids], logprobs=logprobs
    )


def _prepare(
    state: ServerState, body: CompletionRequest
) -> tuple[list[list[int]], list[SamplingParams | BeamSearchParams], list[Echo] | None, list[tuple]]:
    """Each prompt's token ids, checked SamplingParams (4xx errors name the field), with echo what it echoes,
    and its given rows (prompt_embeds: theirs come first, then the text prompts')."""
    embedded = embedded_prompts(state, body)
    texts = [] if embedded and body.prompt in (None, "") else prompt_list(body.prompt)
    state.limits.check(body, len(embedded) + len(texts))
    prompts = [ids for ids, _ in embedded] + [state.encode(p) for p in texts]
    max_tokens = generated_max_tokens(body)
    prompt_logprobs = body.logprobs if body.echo else None
    params = [beam_or_sampling(body, build_params(state, body, ids, OPENAI_DEFAULT_MAX_TOKENS, body.logprobs,
                                                  max_tokens, prompt_logprobs)) for ids in prompts]
    echoes = [_echo(state, body, text, ids) for text, ids in zip(texts, prompts)] if body.echo else None
    return prompts, params, echoes, [rows for _, rows in embedded] + [()] * len(texts)


def _choice(state: ServerState, body: CompletionRequest, prompt_index: int, out: CompletionOutput,
            offset: int = 0) -> dict:
    logprobs = None
    if body.logprobs is not None and out.logprobs is not None:
        logprobs = completion_logprobs(out.token_ids, out.logprobs, offset, state.tokenizer, state.tokens_as_ids)
    return {
        "index": prompt_index * body.n + out.index, "text": out.text, "logprobs": logprobs,
        "finish_reason": out.finish_reason, "stop_reason": out.stop_reason,
    }


async def _stream(state: ServerState, body: CompletionRequest, header: dict,
                  deltas: AsyncIterator[tuple[int, RequestOutput]], prompt_tokens: int,
                  echoes: list[Echo] | None, timeout: float | None) -> AsyncIterator[str]:
    """SSE chunks as tokens arrive (with echo the prompt first), an optional usage chunk, then [DONE];
    a generation that raises (a timeout, a shutdown) ends with an error event instead of the usage."""
    generated, offsets, prompt_logprobs, finished = 0, {}, {}, set()
    try:
        async for i, delta in deltas:
            if delta.error:
                yield sse(error_body(f"generation failed: {delta.error}", "internal_server_error", None, 500))
                continue
            prompt_logprobs.setdefault(i, delta.prompt_logprobs)  # only a request's first delta holds them
            for out in delta.outputs:
                key = (i, out.index)
                if out.token_ids or out.text or (out.finish_reason and key not in finished):  # each finish once
                    generated += 0 if echoes is not None and echoes[i].only else len(out.token_ids)
                    if echoes is not None:
                        out = echoed(out, echoes[i], prompt_logprobs[i], key not in offsets)
                    yield sse({**header, "choices": [_choice(state, body, i, out, offsets.get(key, 0))]})
                    offsets[key] = offsets.get(key, 0) + len(out.text)
                    if out.finish_reason:
                        finished.add(key)
        if body.include_usage():
            yield sse({**header, "choices": [], "usage": usage(prompt_tokens, generated)})
    except Exception as error:  # the status line went out already: the error is the stream's last event
        yield sse(error_event(error, timeout))
    finally:
        await deltas.aclose()  # a client gone mid-stream: abort whatever is still running
    yield DONE
