"""Running requests through `LLM.generate` (the serving engine, which runs every request,
speculating ones included), and comparing what engines with one knob flipped give."""

from __future__ import annotations

from typing import Sequence

from jaxinfer import LLM, SamplingParams


def engine_ids(llm: LLM, prompts: Sequence, params: SamplingParams | Sequence[SamplingParams]) -> list[list[int]]:
    """Generated token ids of each prompt (one params for all, or one per prompt), in order."""
    return [out.token_ids for out in llm.generate(list(prompts), params)]


def engines_with_and_without(model_dir, knob: str, **knobs) -> dict[bool, LLM]:
    """The same model twice, `knob` off (False) and on (True), the other knobs shared."""
    return {flag: LLM(model_dir, **{knob: flag}, **knobs) for flag in (False, True)}


def summary(outputs) -> list:
    """Everything a caller reads from each completion (tokens, text, finish and stop reasons, logprobs)."""
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.logprobs) for c in out.outputs]
            for out in outputs]


def traces_after_warmup(llm: LLM, prompts: Sequence, greedy_tokens: int = 9) -> tuple[int, list[str]]:
    """Warm the engine up, then generate a greedy request (greedy_tokens long) and a sampled one:
    (programs warm-up made ready, the programs traced while generating, which must be none)."""
    from jax import monitoring

    count = llm.engine.warmup()
    traces = []
    monitoring.register_event_duration_secs_listener(
        lambda name, *a, **k: traces.append(name) if name.endswith("jaxpr_trace_duration") else None
    )
    params = [SamplingParams(max_tokens=n, temperature=t, seed=1, ignore_eos=True)
              for n, t in [(greedy_tokens, 0), (20, 0.8)]]
    llm.generate(prompts[:2], params)
    return count, traces
