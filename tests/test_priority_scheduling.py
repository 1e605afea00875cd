"""vLLM's scheduling_policy="priority": admission by (priority, arrival) and preemption of the last in that order."""

from __future__ import annotations

import pytest
from engine_knobs import ENGINE
from test_scheduler import PAGE, decoding, waiting

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.engine import EngineConfig
from jaxinfer.engine.block_manager import BlockManager
from jaxinfer.engine.prompt_checks import check_priority
from jaxinfer.engine.scheduler import Scheduler, SchedulerConfig


def ranked(name: str, priority: int, num_tokens: int = 5):
    request = waiting(name, num_tokens)
    request.priority = priority
    return request


def test_requests_are_admitted_by_priority_then_arrival():
    blocks = BlockManager(64, PAGE, "model", prefix_caching=False)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=64, by_priority=True), blocks)
    for name, priority in [("late", 3), ("a", 1), ("b", 2), ("c", 1)]:
        scheduler.add(ranked(name, priority))
    assert [row.request.request_id for row in scheduler.schedule().prefills] == ["a", "c", "b"]
    assert [r.request_id for r in scheduler.waiting] == ["late"]


def test_fcfs_admits_in_arrival_order():
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=64),
                          BlockManager(64, PAGE, "model", prefix_caching=False))
    for name in ["x", "y", "z", "w"]:
        scheduler.add(ranked(name, 0))
    assert [row.request.request_id for row in scheduler.schedule().prefills] == ["x", "y", "z"]


def test_the_last_in_priority_order_is_preempted_even_when_it_asks_for_pages():
    # Two 9-token decodes fill the pool; each next token needs a third page. Under fcfs the later admitted
    # ("b") goes; under priority the one of the largest priority value, here the one asking first ("a").
    blocks = BlockManager(1 + 2 * BlockManager(2, PAGE, "").pages_for(8), PAGE, "model")
    scheduler = Scheduler(SchedulerConfig(4, 64, 4, decode_steps=1, by_priority=True), blocks)
    scheduler.running = [decoding(blocks, "a", 9), decoding(blocks, "b", 9)]
    scheduler.running[0].priority = 5
    scheduler.add(ranked("queued", 2, 40))  # too long to admit into what a's pages free
    schedule = scheduler.schedule()
    assert [row.request.request_id for row in schedule.decodes] == ["b"]
    assert scheduler.num_preemptions == 1
    assert [r.request_id for r in scheduler.waiting] == ["queued", "a"]  # back in the queue by its priority


def test_a_priority_needs_the_priority_policy_and_an_integer():
    assert check_priority(0, "fcfs") == 0 and check_priority(-3, "priority") == -3
    with pytest.raises(ValueError, match="priority=2 needs scheduling_policy='priority'"):
        check_priority(2, "fcfs")
    with pytest.raises(TypeError, match="priority must be an integer"):
        check_priority(1.5, "priority")
    with pytest.raises(ValueError, match="scheduling_policy must be one of 'fcfs', 'priority', got 'lifo'"):
        EngineConfig(max_seq_len=64, scheduling_policy="lifo")


def test_generate_serves_lower_priorities_first_with_the_same_tokens(checkpoint_dir):
    llm = LLM(checkpoint_dir("llama3"), **ENGINE, scheduling_policy="priority")
    prompts = [[5 + i, 17, 9 + 2 * i, 40, 3 + i, 12] for i in range(8)]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    in_order = llm.generate(prompts, params)
    ranks = [1, 1, 1, 1, 0, 0, 0, 0]  # the last four arrive last and go first
    ranked_outputs = llm.generate(prompts, params, priority=ranks)
    assert [o.outputs[0].token_ids for o in ranked_outputs] == [o.outputs[0].token_ids for o in in_order]

    def scheduled(output):
        return output.metrics.arrival_time + output.metrics.queue_time

    first = [scheduled(o) for o, rank in zip(ranked_outputs, ranks) if rank == 0]
    later = [scheduled(o) for o, rank in zip(ranked_outputs, ranks) if rank == 1]
    assert max(first) <= min(later)
    with pytest.raises(ValueError, match="got 2 priorities for 8 prompts"):
        llm.generate(prompts, params, priority=[0, 1])
