"""Token ids of requests run through `LLM.generate` (the serving engine, which runs every request,
speculating ones included)."""

from __future__ import annotations

from typing import Sequence

from jaxinfer import LLM, SamplingParams


def engine_ids(llm: LLM, prompts: Sequence, params: SamplingParams | Sequence[SamplingParams]) -> list[list[int]]:
    """Generated token ids of each prompt (one params for all, or one per prompt), in order."""
    return [out.token_ids for out in llm.generate(list(prompts), params)]
