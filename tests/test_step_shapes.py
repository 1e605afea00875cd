"""Step shapes: how steps are packed and padded, and that warm-up compiles every shape the scheduler makes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxinfer.config.buckets import ragged_shapes, token_bucket, token_buckets
from jaxinfer.config.engine import EngineConfig
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.block_manager import BlockManager
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Schedule, Scheduler, SchedulerConfig
from jaxinfer.engine.step_builder import build_step, program_shapes, step_shape


def test_token_buckets_are_powers_of_two_then_the_budget():
    assert token_buckets(512) == [16, 32, 64, 128, 256, 512]
    assert token_buckets(448) == [16, 32, 64, 128, 256, 448]  # a full step pads nothing
    assert token_buckets(500) == [16, 32, 64, 128, 256, 512]  # rounded up to a multiple of 16
    assert [token_bucket(n, 448) for n in [1, 16, 17, 300, 448]] == [16, 16, 32, 448, 448]


def test_a_default_engine_has_few_programs():
    """13 step programs for default knobs (the issue's bound is 32), whatever the model."""
    shapes = program_shapes(EngineConfig(max_seq_len=2048))
    assert len(shapes) == 13
    assert ragged_shapes(512, 64) == [(16, 16), (32, 32), (64, 64), (128, 64), (256, 64), (512, 64)]
    with_verify = program_shapes(EngineConfig(max_seq_len=2048), verify_chunk=5)
    assert len(with_verify) == 20 and ("verify", 64 * 5, 64) in with_verify


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


def scheduler(config: EngineConfig) -> Scheduler:
    blocks = BlockManager(config.num_pages, config.page_size, "test-model")
    return Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, config.max_prefill_seqs,
                                     config.decode_steps), blocks)


def serve_random(seed: int, config: EngineConfig = CONFIG, check=lambda schedule: None) -> list[Schedule]:
    """The schedules of a random serving run (prompts 1-700 tokens; CONFIG's pool is small enough to
    preempt), each passed to check before the engine would apply it."""
    sched = scheduler(config)
    rng = np.random.default_rng(seed)
    for i in range(40):
        prompt = rng.integers(3, 100, rng.integers(1, 700)).tolist()
        params = SamplingParams(max_tokens=int(rng.integers(1, 40)), temperature=0)
        sched.add(Request(f"r{i}", 0, None, prompt, params, seed=0, stop_ids=(2,)))
    schedules = []
    while sched.running or sched.waiting:
        schedule = sched.schedule()
        assert not schedule.empty
        schedules.append(schedule)
        check(schedule)
        advance(sched, schedule)
    return schedules


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_scheduled_shape_is_one_warmup_compiles(seed):
    """The padded shape of every step is among program_shapes, so a warmed engine never compiles."""
    seen = {step_shape(schedule, CONFIG) for schedule in serve_random(seed)}
    assert seen <= set(program_shapes(CONFIG))
    assert {kind for kind, _, _ in seen} == {"ragged", "decode"}


@pytest.mark.parametrize("seed", [0, 1])
def test_steps_pack_each_rows_tokens_end_to_end(seed):
    """Built steps: each row's tokens contiguous at its positions, padding at position -1 and
    belonging to no real row, last_index on each row's last token, one fixed page-table width."""
    config = dataclasses.replace(CONFIG, num_pages=2000)

    def check(schedule: Schedule) -> None:
        step = build_step(schedule, config)
        kind, tokens, rows = step_shape(schedule, config)
        assert step.tokens.shape == (tokens,) and step.lengths.shape == (rows,) and step.decode == (kind == "decode")
        offset = 0
        for r, row in enumerate(schedule.decodes + schedule.prefills):
            span = slice(offset, offset + row.count)
            assert (step.token_rows[span] == r).all()
            assert step.positions[span].tolist() == list(range(row.start, row.start + row.count))
            assert step.tokens[span].tolist() == row.request.ids_between(row.start, row.start + row.count)
            assert step.last_index[r] == offset + row.count - 1 and step.samples[r] == row.samples
            offset += row.count
        assert (step.positions[offset:] == -1).all() and (step.query_lens[len(schedule.decodes + schedule.prefills):] == 0).all()

    serve_random(seed, config, check)


def test_padding_stays_small_on_a_prompt_heavy_run():
    """Padded tokens of a random run's steps with prefill chunks: the budget fills most of them exactly."""
    padded = real = 0
    for schedule in serve_random(0, dataclasses.replace(CONFIG, num_pages=2000)):
        if schedule.prefills:
            padded += step_shape(schedule, CONFIG)[1]
            real += sum(row.count for row in schedule.decodes + schedule.prefills)
    assert padded / real < 1.2, padded / real


def add_prompt(sched: Scheduler, name: str, first: int, length: int) -> None:
    params = SamplingParams(max_tokens=4, temperature=0)
    sched.add(Request(name, 0, None, list(range(first, first + length)), params, seed=0, stop_ids=()))


def test_a_long_prompt_is_cut_at_the_budget():
    sched = scheduler(dataclasses.replace(CONFIG, max_num_batched_tokens=500))
    add_prompt(sched, "long", 3, 700)
    schedule = sched.schedule()
    assert [row.count for row in schedule.prefills] == [500]
    advance(sched, schedule)
    assert [row.count for row in sched.schedule().prefills] == [200]


def test_prefill_rows_share_the_budget_without_padding_to_each_other():
    sched = scheduler(dataclasses.replace(CONFIG, max_num_batched_tokens=512))
    add_prompt(sched, "short", 3, 40)
    add_prompt(sched, "long", 1000, 300)
    schedule = sched.schedule()
    assert [row.count for row in schedule.prefills] == [40, 300]
    assert step_shape(schedule, CONFIG) == ("ragged", 448, 8)
