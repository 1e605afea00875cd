"""Running requests through `LLMEngine` steps directly (`LLM.generate` sends plain-sampling
draft-model and EAGLE requests to its static batches instead)."""

from __future__ import annotations

from typing import Sequence

from jaxinfer import LLM, SamplingParams


def engine_ids(llm: LLM, prompts: Sequence, params: SamplingParams | Sequence[SamplingParams]) -> list[list[int]]:
    """Generated token ids of each prompt (one params for all, or one per prompt), in order."""
    params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    return [out.token_ids for out in llm._engine_generate(list(prompts), params)]
