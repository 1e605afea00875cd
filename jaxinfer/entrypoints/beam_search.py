"""Beam search over the engine, as vLLM runs it: each step, every live beam of every prompt is one
one-token request asking its top 2 x beam_width logprobs, all in one batch. The beams of a prompt
share its pages through prefix caching, so a step prefills only each beam's last partial page."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

from jaxinfer.config.beam_search import BeamSearchParams
from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.beams import BeamSearchOutput, PromptBeams, candidates_of, search_steps, step_params
from jaxinfer.engine.outputs import RequestOutput

# Runs prompts (token ids) to the end with one SamplingParams, and one adapter (or None) and images each.
StepGenerate = Callable[[list[list[int]], SamplingParams, list[LoRARequest | None], list[tuple]], list[RequestOutput]]


def beams_refused(runner: Any) -> str | None:
    """Why an engine's runner cannot run beam search, or None: each step's beams go in as prompts, and where a
    prompt is one bidirectional prefix (PaliGemma's) their generated tokens would join it."""
    if getattr(runner.vision, "whole_prompt", False):
        return ("beam search is not served for PaliGemma yet (each step's beams run as prompts, whose tokens would "
                "all join its bidirectional prefix); use SamplingParams(temperature=0) for greedy tokens")
    return None


def beam_search(
    generate: StepGenerate, prompts: Sequence[list[int]], params: BeamSearchParams, eos_ids: Sequence[int],
    decode: Callable[[list[int]], str], lora_requests: Sequence[LoRARequest | None],
    on_step: Callable[[], object] = lambda: None, images: Sequence[tuple] | None = None,
) -> list[BeamSearchOutput]:
    """Each prompt's beam_width best sequences, in prompt order; on_step after each batch of steps. images:
    each prompt's (a vision-language model's), run with each of its beams' steps (their pages shared by
    content hash, their rows encoded once)."""
    images = images or [()] * len(prompts)
    searches = [PromptBeams(ids, params, eos_ids, lora, found)
                for ids, lora, found in zip(prompts, lora_requests, images, strict=True)]
    steps, step = search_steps(searches), step_params(params)
    with contextlib.suppress(StopIteration):
        beams = next(steps)
        while True:
            outputs = generate([beam.tokens for beam in beams], step, [beam.lora_request for beam in beams],
                               [beam.images for beam in beams])
            on_step()
            beams = steps.send(candidates_of(outputs))
    return [BeamSearchOutput(search.best(decode)) for search in searches]
