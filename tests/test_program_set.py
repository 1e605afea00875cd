"""A small program set: warm-up compiles every program an engine runs, and after it no request mix compiles.

Compiles are counted from JAX's `backend_compile_duration` events (recorded for a compile and
for a load from the persistent cache alike), the listener `runtime.memory_maps` already uses.
"""

from __future__ import annotations

import numpy as np
import pytest
from compile_counter import CompileCounter
from engine_knobs import WIDE  # the workload's 150-token prompt hits more pages than a step ships

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.config.engine import EngineConfig
from jaxinfer.engine.step_builder import program_shapes
from jaxinfer.runtime.prompt_logprobs import prompt_buckets

REPEATING = [5, 6, 7, 8] * 6  # prompt lookup finds drafts in it


@pytest.fixture(scope="module")
def counter() -> CompileCounter:
    return CompileCounter()


def mixed_workload(llm: LLM, seed: int) -> None:
    """Every option the engine takes, long and short prompts, n > 1, in one generate call and a stream."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, 250, int(n)).tolist() for n in (1, 5, 40, 90, 33)] + [REPEATING]
    params = [
        SamplingParams(max_tokens=12, temperature=0, logprobs=5),
        SamplingParams(max_tokens=9, temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, seed=1, prompt_logprobs=3),
        SamplingParams(max_tokens=20, temperature=1.0, presence_penalty=0.5, frequency_penalty=0.3,
                       repetition_penalty=1.3, seed=2, n=2),
        SamplingParams(max_tokens=7, temperature=0, stop_token_ids=list(range(100, 140)), logit_bias={9: 5.0, 11: -100}),
        SamplingParams(max_tokens=15, min_tokens=10, temperature=0.7, seed=3, stop=["x", "yz"]),
        SamplingParams(max_tokens=30, temperature=0),
    ]
    llm.generate(prompts, params)
    for _ in llm.stream(prompts[1], SamplingParams(max_tokens=6, temperature=0, logprobs=2)):
        pass
    # A prefix hit on many pages gives a row more table entries than a step ships: the whole
    # tables are sent instead, as data of the same shape.
    long = rng.integers(3, 250, 150).tolist()
    for _ in range(2):
        llm.generate([long], SamplingParams(max_tokens=2, temperature=0))


@pytest.mark.parametrize("method", [None, "ngram", "ngram_device"], ids=["plain", "ngram", "ngram-device"])
def test_nothing_compiles_after_warmup(checkpoint_dir, counter, method):
    spec = None if method is None else SpeculativeConfig(method=method, num_speculative_tokens=3, adaptive=False)
    llm = LLM(checkpoint_dir("llama3"), speculative=spec, **WIDE)
    programs = llm.engine.warmup()
    verify = None if spec is None else 4
    steps = program_shapes(llm.engine.config, verify)
    assert programs == llm.engine.program_count() == len(steps) + 1 + len(prompt_buckets(WIDE["max_seq_len"]))
    seconds = llm.engine.runner.warmup_seconds  # what a warm start pays, and a cold one
    assert seconds["trace"] > 0 and seconds["compile"] > 0 and seconds["stored"] == 0  # the suite has the store off
    counter.active = True
    try:
        mixed_workload(llm, seed=0)
    finally:
        counter.active = False
    assert counter.count == 0
    if method is not None:
        assert llm.engine.speculation_metrics()["drafted"] > 0


def test_default_knobs_need_few_programs():
    """18 programs for the default knobs at max_seq_len 2048 (13 steps, the penalty-slot reset, 4
    prompt-logprobs passes), 17 at 1024: the issue's bound is 32."""
    for max_seq_len, expected in ((2048, 18), (1024, 17)):
        config = EngineConfig(max_seq_len=max_seq_len)
        assert len(program_shapes(config)) + 1 + len(prompt_buckets(max_seq_len)) == expected
    # Speculating with a draft model or EAGLE head: 7 verify programs and 6 ragged steps without its reads.
    config = EngineConfig(max_seq_len=2048)
    assert len(program_shapes(config, verify_chunk=5, draft_on_device=True)) + 1 + len(prompt_buckets(2048)) == 31
