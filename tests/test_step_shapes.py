"""Step shapes: how chunks are padded, and that warm-up compiles every shape the scheduler makes."""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer.engine.block_manager import BlockManager
from jaxinfer.engine.config import EngineConfig
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Schedule, Scheduler, SchedulerConfig
from jaxinfer.engine.step_builder import (
    bucket, chunk_bucket, chunk_buckets, chunk_step_for, shape_buckets, warmup_shapes,
)
from jaxinfer.sampling_params import SamplingParams


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


@pytest.mark.parametrize("seed,chunk_step", [(0, 64), (1, 64), (0, 512)])
def test_every_scheduled_shape_is_one_warmup_compiles(seed, chunk_step):
    """A random serving run (prompts 1-700 tokens, a pool small enough to preempt): the padded
    shape of every step is among warmup_shapes, so a warmed engine never compiles."""
    config = EngineConfig(max_seq_len=1024, max_num_seqs=8, max_num_batched_tokens=448, max_prefill_seqs=4,
                          num_pages=120, page_size=16, decode_steps=4)
    max_pages, min_pages = bucket(config.pages_per_seq), 8
    blocks = BlockManager(config.num_pages, config.page_size, "test-model")
    scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens,
                                          config.max_prefill_seqs, config.decode_steps), blocks)
    rng = np.random.default_rng(seed)
    for i in range(40):
        prompt = rng.integers(3, 100, rng.integers(1, 700)).tolist()
        params = SamplingParams(max_tokens=int(rng.integers(1, 40)), temperature=0)
        scheduler.add(Request(f"r{i}", 0, None, prompt, params, seed=0, stop_ids=()))
    allowed = set(warmup_shapes(config, min_pages, max_pages, chunk_step=chunk_step))
    seen = set()
    while scheduler.running or scheduler.waiting:
        schedule = scheduler.schedule()
        assert not schedule.empty
        shape = shape_buckets(schedule, config.page_size, max_pages, min_pages, False, chunk_step)
        seen.add(shape + (schedule.num_steps,))
        advance(scheduler, schedule)
    assert seen <= allowed
    odd_chunks = {chunk for _, rows, chunk, _, _ in seen if rows} - {16, 32, 64, 128, 256, 512}
    assert bool(odd_chunks) == (chunk_step == 64)  # multiples of 64 occur on CPU only
