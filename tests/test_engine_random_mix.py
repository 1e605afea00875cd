"""Random request mixes on a tight engine against each request run alone on a roomy one.

The other engine tests change one scheduling choice at a time; here they all happen together:
requests arrive between steps, share prefixes (prefix-cache hits), overflow a small page pool
(preemption by recompute), split into prefill chunks, decode several steps per call, ask for
two seeded samples, and some are aborted mid-flight. Every request that is not aborted must
get exactly the tokens it gets alone, and the pool must be whole again at the end.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.speculative.config import SpeculativeConfig

MAX_SEQ_LEN = 96
TIGHT = dict(max_num_seqs=4, max_num_batched_tokens=32, max_prefill_seqs=2, decode_steps=4, num_pages=14, page_size=8)
ROOMY = dict(max_num_seqs=1, max_num_batched_tokens=MAX_SEQ_LEN, decode_steps=1, num_pages=32, page_size=8,
             enable_prefix_caching=False)


@dataclass(frozen=True)
class Arrival:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    step: int  # the engine step before which it is added
    abort_at: int | None  # the step after which it is aborted, if still running


def random_params(rng: random.Random, room: int, greedy_only: bool) -> SamplingParams:
    max_tokens = min(room, rng.randint(1, 45))
    if greedy_only or rng.random() < 0.5:
        stops = rng.sample(range(3, 250), rng.choice([0, 0, 3]))
        return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, stop_token_ids=stops)
    return SamplingParams(
        max_tokens=max_tokens, temperature=rng.choice([0.7, 1.0]), top_k=rng.choice([0, 20]),
        top_p=rng.choice([1.0, 0.9]), seed=rng.randrange(1000), n=rng.choice([1, 2]), ignore_eos=True,
        min_tokens=min(max_tokens, rng.choice([0, 3])),
    )


def random_workload(seed: int, greedy_only: bool = False) -> list[Arrival]:
    """5-10 requests; most start with part of one shared prefix; tails repeat (n-gram drafts hit)."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, 250) for _ in range(rng.choice([16, 20, 33, 40]))]
    arrivals = []
    for i in range(rng.randint(5, 10)):
        head = shared[: rng.randrange(len(shared) + 1)] if rng.random() < 0.6 else []
        tail = [rng.randrange(3, 250) for _ in range(rng.randint(1, 10))] * rng.randint(1, 4)
        prompt = head + tail
        step = rng.randint(0, 12)
        abort_at = step + 3 if rng.random() < 0.15 else None
        arrivals.append(Arrival(f"r{i}", prompt, random_params(rng, MAX_SEQ_LEN - len(prompt), greedy_only), step,
                                abort_at))
    return arrivals


def collect(outputs: dict[str, dict[int, list[int]]], deltas) -> None:
    for delta in deltas:
        for sample in delta.outputs:
            outputs.setdefault(delta.request_id, {}).setdefault(sample.index, []).extend(sample.token_ids)


def run_mixed(llm: LLM, arrivals: list[Arrival]) -> tuple[dict[str, list[list[int]]], set[str]]:
    """Every request's samples' ids on one engine, with arrivals and aborts at their steps."""
    engine, outputs, aborted = llm.engine, {}, set()
    waiting = sorted(arrivals, key=lambda a: a.step)
    step = 0
    while waiting or engine.has_unfinished():
        while waiting and waiting[0].step <= step:
            arrival = waiting.pop(0)
            engine.add_request(arrival.request_id, arrival.prompt, arrival.params)
        collect(outputs, engine.step())
        step += 1
        for arrival in arrivals:
            if arrival.abort_at == step and arrival.request_id in engine.groups:
                engine.abort(arrival.request_id)
                aborted.add(arrival.request_id)
    return {rid: [samples[i] for i in sorted(samples)] for rid, samples in outputs.items()}, aborted


def run_alone(llm: LLM, arrival: Arrival) -> list[list[int]]:
    outputs, _ = run_mixed(llm, [Arrival(arrival.request_id, arrival.prompt, arrival.params, 0, None)])
    return outputs[arrival.request_id]


@pytest.fixture(scope="module")
def model(checkpoint_dir):
    return checkpoint_dir("mistral")  # a sliding window: pages leave the window while others are shared


@pytest.fixture(scope="module")
def roomy(model):
    return LLM(model, dtype="float32", max_seq_len=MAX_SEQ_LEN, **ROOMY)


def check_mix(tight: LLM, roomy: LLM, arrivals: list[Arrival]) -> None:
    free_before = tight.engine.blocks.usable_pages
    mixed, aborted = run_mixed(tight, arrivals)
    for arrival in arrivals:
        if arrival.request_id not in aborted:
            assert mixed[arrival.request_id] == run_alone(roomy, arrival), arrival
    assert tight.engine.blocks.usable_pages == free_before


# stop_early=False: multi-step calls run all their iterations, finished rows idling (a GPU's choice).
@pytest.mark.parametrize("seed,stop_early", [(2, True), (6, False)])
def test_random_mix_matches_each_request_alone(model, roomy, seed, stop_early):
    tight = LLM(model, dtype="float32", max_seq_len=MAX_SEQ_LEN, **TIGHT)
    tight.engine.runner.stop_early = stop_early
    check_mix(tight, roomy, random_workload(seed))
    metrics = tight.metrics()
    assert metrics["num_preemptions"] > 0 and metrics["prefix_cache_hits"] > 0


def test_random_mix_with_ngram_speculation_matches_greedy_alone(model, roomy):
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, adaptive=False)
    tight = LLM(model, dtype="float32", max_seq_len=MAX_SEQ_LEN, speculative=spec, **TIGHT)
    check_mix(tight, roomy, random_workload(2, greedy_only=True))
    metrics = tight.metrics()
    assert metrics["spec_decode_num_accepted_tokens"] > 0 and metrics["num_preemptions"] > 0
