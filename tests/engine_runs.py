"""Running requests through `LLMEngine` steps directly (`LLM.generate` sends plain-sampling
draft-model and EAGLE requests to its static batches instead)."""

from __future__ import annotations

from typing import Sequence

from jaxinfer import LLM, SamplingParams


def engine_ids(llm: LLM, prompts: Sequence, params: SamplingParams | Sequence[SamplingParams]) -> list[list[int]]:
    """Generated token ids of each prompt (one params for all, or one per prompt), in order."""
    engine, ids = llm.engine, {}
    params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), prompt, p)
    while engine.has_unfinished():
        for out in engine.step():
            ids.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    return [ids[str(i)] for i in range(len(prompts))]
