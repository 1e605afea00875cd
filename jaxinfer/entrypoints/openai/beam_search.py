"""`use_beam_search` (vLLM's field) on completions and chat: the prompt's n best beams are the choices.

Each step runs every live beam as a one-token request through the async engine (beside whatever
else is running), as `LLM.beam_search` does through the sync one. Fields beam search cannot honour
(stop strings, penalties, logprobs, constraints, ...) are 400s naming them, never ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from typing import AsyncIterator

from jaxinfer.checkpoint.tokenizer import decode_text
from jaxinfer.config.beam_search import MAX_BEAM_WIDTH, BeamSearchParams
from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine import CompletionOutput, RequestOutput
from jaxinfer.engine.beams import BeamSearchSequence, PromptBeams, candidates_of, search_steps, step_params
from jaxinfer.engine.outputs import accumulate
from jaxinfer.entrypoints.beam_search import beams_refused
from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.protocol import SamplingFields
from jaxinfer.entrypoints.openai.serving import ServerState

# What a beam search request may set: the rest changes sampling, which beam search does not do.
BEAM_FIELDS = {
    "model", "prompt", "messages", "add_generation_prompt", "max_tokens", "max_completion_tokens", "n",
    "temperature", "ignore_eos", "stream", "stream_options", "user", "timeout", "use_beam_search", "length_penalty",
    "prompt_embeds",
}


def beam_or_sampling(body: SamplingFields, params: SamplingParams) -> SamplingParams | BeamSearchParams:
    """A use_beam_search request's BeamSearchParams (n beams of params.max_tokens), else params."""
    if not body.use_beam_search:
        if body.length_penalty != 1.0:
            raise APIError("length_penalty ranks beams; it needs use_beam_search: true", param="length_penalty")
        return params
    refused = sorted(name for name in body.model_fields_set - BEAM_FIELDS
                     if getattr(body, name) != type(body).model_fields[name].default)
    if refused:
        raise APIError(f"{refused[0]} is not supported with use_beam_search (it ranks the likeliest continuations "
                       f"without sampling, stops or constraints); leave it out", param=refused[0])
    if not 1 <= body.n <= MAX_BEAM_WIDTH:
        raise APIError(f"n is the beam width with use_beam_search and must be in [1, {MAX_BEAM_WIDTH}], got {body.n}",
                       param="n")
    try:
        return BeamSearchParams(body.n, params.max_tokens, body.ignore_eos, body.temperature or 0.0,
                                body.length_penalty)
    except (TypeError, ValueError) as error:
        field = str(error).split(" ", 1)[0]
        raise APIError(str(error), param=field) from None


def generation(state: ServerState, ids: list[int], params: SamplingParams | BeamSearchParams, request_id: str,
               deadline: float | None, streamed: bool, adapter: LoRARequest | None,
               images: tuple = (), priority: int = 0) -> AsyncIterator[RequestOutput]:
    """One prompt's outputs: the engine's deltas, or its beams as one final output (images: the prompt's,
    a vision-language model's; priority: vLLM's, every beam step's requests run at it)."""
    if isinstance(params, BeamSearchParams):
        if (refused := beams_refused(state.engine.engine.runner)) is not None:
            raise APIError(refused, param="use_beam_search")
        return beam_stream(state, ids, params, request_id, deadline, adapter, images, priority)
    with_images = {"images": images} if images else {}
    state.request_log.request(request_id, ids, params)
    outputs = state.engine.generate(ids, params, request_id, deadline, streamed=streamed, lora_request=adapter,
                                    priority=priority, **with_images)
    return state.request_log.outputs_of(request_id, outputs) if state.request_log.outputs else outputs


async def beam_stream(state: ServerState, ids: list[int], params: BeamSearchParams, request_id: str,
                      deadline: float | None, adapter: LoRARequest | None, images: tuple = (),
                      priority: int = 0) -> AsyncIterator[RequestOutput]:
    """The search's one final output (its beams as samples), or the first failed step's output (images: the
    prompt's, run with every step)."""
    with_images = {"images": images} if images else {}
    search = PromptBeams(ids, params, state.engine.engine.model_config.eos_token_ids, adapter)
    steps, step = search_steps([search]), step_params(params)
    with contextlib.suppress(StopIteration):
        beams = next(steps)
        for number in itertools.count():
            outputs = await asyncio.gather(*(
                _final(state.engine.generate(beam.tokens, step, f"{request_id}-{number}-{k}", deadline,
                                             lora_request=adapter, priority=priority, **with_images))
                for k, beam in enumerate(beams)))
            failed = [output for output in outputs if output.error]
            if failed:
                yield dataclasses.replace(failed[0], request_id=request_id)
                return
            beams = steps.send(candidates_of(outputs))
    decode = (lambda generated: decode_text(state.tokenizer, generated)) if state.tokenizer else (lambda _: "")
    yield RequestOutput(request_id, None, ids, [_sample(i, beam, len(ids)) for i, beam in
                                                enumerate(search.best(decode))], finished=True)


async def _final(deltas: AsyncIterator[RequestOutput]) -> RequestOutput:
    total = None
    async with contextlib.aclosing(deltas):  # cancelled (a client gone): the request is aborted
        async for delta in deltas:
            total = accumulate(total, delta)
    return total


def _sample(index: int, beam: BeamSearchSequence, prompt_len: int) -> CompletionOutput:
    return CompletionOutput(index, beam.text or "", beam.tokens[prompt_len:], beam.finish_reason,
                            cumulative_logprob=beam.cum_logprob)
