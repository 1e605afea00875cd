"""Step shapes: how chunks are padded, and that warm-up compiles every shape the scheduler makes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxinfer.config.buckets import bucket, chunk_bucket, chunk_buckets, chunk_step_for
from jaxinfer.config.engine import EngineConfig
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.block_manager import BlockManager
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Schedule, Scheduler, SchedulerConfig
from jaxinfer.engine.step_builder import program_steps, shape_buckets, warmup_shapes


def test_chunks_pad_to_powers_of_two_then_to_multiples_of_64():
    lengths = [0, 1, 16, 17, 33, 64, 65, 128, 129, 300, 448, 449]
    assert [chunk_bucket(n) for n in lengths] == [0, 16, 16, 32, 64, 64, 128, 128, 192, 320, 448, 512]


def test_accelerators_pad_chunks_to_powers_of_two():
    step = chunk_step_for("gpu", 448)
    assert [chunk_bucket(n, step) for n in [1, 17, 65, 129, 300, 448]] == [16, 32, 128, 256, 512, 512]
    assert chunk_buckets(448, step) == [16, 32, 64, 128, 256, 512] and chunk_step_for("cpu", 448) == 64


@pytest.mark.parametrize("step", [64, 512])
@pytest.mark.parametrize("high", [1, 16, 40, 64, 100, 512, 777])
def test_chunk_buckets_are_every_padded_length(high, step):
    assert chunk_buckets(high, step) == sorted({chunk_bucket(n, step) for n in range(1, high + 1)})


def advance(scheduler: Scheduler, schedule: Schedule) -> None:
    """What the engine does with a step's outputs: tokens computed, one new token per sampling
    row and step, requests that reach max_tokens removed."""
    for row in schedule.decodes + schedule.prefills:
        request = row.request
        request.num_computed = row.start + row.count
        if row.samples:
            new = min(schedule.num_steps, request.max_total - request.num_tokens)
            request.output_ids += [7] * new
            request.num_computed += new - 1
        if request.num_tokens >= request.max_total:
            scheduler.remove(request)


CONFIG = EngineConfig(max_seq_len=1024, max_num_seqs=8, max_num_batched_tokens=448, max_prefill_seqs=4,
                      num_pages=120, page_size=16, decode_steps=4)
MAX_PAGES, MIN_PAGES = bucket(CONFIG.pages_per_seq), 8


def scheduler(config: EngineConfig, tight_chunk_step: int | None) -> Scheduler:
    blocks = BlockManager(config.num_pages, config.page_size, "test-model")
    return Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, config.max_prefill_seqs,
                                     config.decode_steps, tight_chunk_step=tight_chunk_step), blocks)


def serve_random(
    seed: int, chunk_step: int, tight_chunk_step: int | None, config: EngineConfig = CONFIG
) -> list[tuple[tuple, Schedule]]:
    """A random serving run (prompts 1-700 tokens; CONFIG's pool is small enough to preempt):
    each step's padded shape (decode rows, prefill rows, chunk, pages, steps variant) and its schedule."""
    sched = scheduler(config, tight_chunk_step)
    rng = np.random.default_rng(seed)
    for i in range(40):
        prompt = rng.integers(3, 100, rng.integers(1, 700)).tolist()
        params = SamplingParams(max_tokens=int(rng.integers(1, 40)), temperature=0)
        sched.add(Request(f"r{i}", 0, None, prompt, params, seed=0, stop_ids=()))
    steps = []
    while sched.running or sched.waiting:
        schedule = sched.schedule()
        assert not schedule.empty
        shape = shape_buckets(schedule, config.page_size, MAX_PAGES, MIN_PAGES, False, chunk_step)
        steps.append((shape + (program_steps(schedule.num_steps, config.decode_steps),), schedule))
        advance(sched, schedule)
    return steps


@pytest.mark.parametrize("seed,chunk_step,tight", [(0, 64, 64), (1, 64, 64), (0, 64, None), (0, 512, None)])
def test_every_scheduled_shape_is_one_warmup_compiles(seed, chunk_step, tight):
    """The padded shape of every step is among warmup_shapes, so a warmed engine never compiles."""
    seen = {shape for shape, _ in serve_random(seed, chunk_step, tight)}
    assert seen <= set(warmup_shapes(CONFIG, MIN_PAGES, MAX_PAGES, chunk_step=chunk_step))
    odd_chunks = {chunk for _, rows, chunk, _, _ in seen if rows} - {16, 32, 64, 128, 256, 512}
    assert bool(odd_chunks) == (chunk_step == 64)  # multiples of 64 occur on CPU only


def prefill_padding(seed: int, tight: int | None) -> tuple[int, int]:
    """(padded, real) prefill tokens of the random run with CPU chunk buckets, without preemptions."""
    padded = real = 0
    for (_, rows, chunk, _, _), schedule in serve_random(seed, 64, tight, dataclasses.replace(CONFIG, num_pages=2000)):
        padded += rows * chunk
        real += sum(row.count for row in schedule.prefills)
    return padded, real


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tight_chunks_pad_less_for_the_same_prompts(seed):
    tight, loose = prefill_padding(seed, 64), prefill_padding(seed, None)
    assert tight[1] == loose[1]  # every prompt token is computed once either way (no preemption)
    assert tight[0] - tight[1] < 0.8 * (loose[0] - loose[1])


def add_prompt(sched: Scheduler, name: str, first: int, length: int) -> None:
    params = SamplingParams(max_tokens=4, temperature=0)
    sched.add(Request(name, 0, None, list(range(first, first + length)), params, seed=0, stop_ids=()))


@pytest.mark.parametrize("tight,first", [(64, 448), (None, 500)])
def test_a_cut_chunk_ends_on_a_bucket_edge_where_padding_costs(tight, first):
    sched = scheduler(dataclasses.replace(CONFIG, max_num_batched_tokens=500), tight)
    add_prompt(sched, "long", 3, 700)
    schedule = sched.schedule()
    assert [row.count for row in schedule.prefills] == [first]
    advance(sched, schedule)
    assert [row.count for row in sched.schedule().prefills] == [700 - first]


@pytest.mark.parametrize("tight,counts", [(64, [40, 64]), (None, [40, 256])])
def test_a_later_row_never_widens_the_chunk_where_padding_costs(tight, counts):
    sched = scheduler(dataclasses.replace(CONFIG, max_num_batched_tokens=512), tight)
    add_prompt(sched, "short", 3, 40)
    add_prompt(sched, "long", 1000, 300)
    assert [row.count for row in sched.schedule().prefills] == counts
