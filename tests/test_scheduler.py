"""Scheduler decisions on a hand-made pool (no jax): what multi-step decode reserves and whom it preempts."""

from __future__ import annotations

from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.block_manager import BlockManager
from jaxinfer.engine.request import Request, Status
from jaxinfer.engine.scheduler import STREAM_BURST_SECONDS, Scheduler, SchedulerConfig

PAGE = 4


def decoding(blocks: BlockManager, name: str, num_tokens: int, max_tokens: int = 20) -> Request:
    """A running request whose last token is the only one not in the cache, holding just the pages that takes."""
    request = Request(name, 0, None, list(range(3, 3 + num_tokens - 1)), SamplingParams(max_tokens=max_tokens), 0, ())
    request.output_ids = [7]
    request.num_computed = num_tokens - 1
    request.pages = blocks.allocate(blocks.pages_for(num_tokens - 1))
    request.status = Status.RUNNING
    return request


def full_pool_scheduler(num_tokens: int, decode_steps: int = 4, lookahead: int = 1) -> Scheduler:
    """Two decoding requests of num_tokens that hold every page of the pool."""
    blocks = BlockManager(1 + 2 * BlockManager(2, PAGE, "").pages_for(num_tokens - 1), PAGE, "model")
    scheduler = Scheduler(SchedulerConfig(4, 64, 4, decode_steps, lookahead=lookahead), blocks)
    scheduler.running = [decoding(blocks, "a", num_tokens), decoding(blocks, "b", num_tokens)]
    assert blocks.usable_pages == 0
    return scheduler


def test_multi_step_decode_runs_fewer_steps_rather_than_preempt():
    # 6 tokens in 2 pages of 4: one step fits (position 5), four would need position 8 (a third page each).
    scheduler = full_pool_scheduler(num_tokens=6)
    schedule = scheduler.schedule()
    assert scheduler.num_preemptions == 0 and not scheduler.waiting
    assert [row.request.request_id for row in schedule.decodes] == ["a", "b"]
    assert schedule.num_steps == schedule.lookahead == 3  # positions 5..7: the pages already held


def test_speculative_lookahead_shrinks_to_the_pages_held():
    scheduler = full_pool_scheduler(num_tokens=6, lookahead=10)
    schedule = scheduler.schedule()
    assert scheduler.num_preemptions == 0 and schedule.all_decode
    assert schedule.lookahead == 3 and schedule.num_steps == 3  # drafts then fit in 2 tokens per row


def test_a_single_step_that_cannot_run_still_preempts():
    # 9 tokens: position 8 needs a third page, and the pool has none.
    scheduler = full_pool_scheduler(num_tokens=9)
    schedule = scheduler.schedule()
    assert scheduler.num_preemptions == 1 and [r.request_id for r in scheduler.waiting] == ["b"]
    assert [row.request.request_id for row in schedule.decodes] == ["a"]


def test_a_roomy_pool_reserves_every_step():
    blocks = BlockManager(64, PAGE, "model")
    scheduler = Scheduler(SchedulerConfig(4, 64, 4, decode_steps=4), blocks)
    scheduler.running = [decoding(blocks, "a", 6), decoding(blocks, "b", 6)]
    schedule = scheduler.schedule()
    assert schedule.num_steps == 4 and all(len(row.request.pages) == 3 for row in schedule.decodes)


def test_a_streamed_request_limits_the_call_to_the_stream_interval():
    """Someone watching a stream gets its tokens every stream_interval steps; alone, the batch runs decode_steps."""
    blocks = BlockManager(64, PAGE, "model")
    scheduler = Scheduler(SchedulerConfig(4, 64, 4, decode_steps=8, stream_interval=2), blocks)
    scheduler.running = [decoding(blocks, "a", 6), decoding(blocks, "b", 6)]
    assert scheduler.schedule().num_steps == 8
    scheduler.running[1].streamed = True
    assert scheduler.schedule().num_steps == 2
    scheduler.remove(scheduler.running[1])  # the stream finished
    assert scheduler.schedule().num_steps == 8


def test_streams_are_paced_by_the_measured_step_time():
    """stream_interval None: a streamed row's calls run as many steps as take STREAM_BURST_SECONDS."""
    blocks = BlockManager(64, PAGE, "model")
    scheduler = Scheduler(SchedulerConfig(4, 64, 4, decode_steps=8), blocks)
    scheduler.running = [decoding(blocks, "a", 6)]
    scheduler.running[0].streamed = True
    assert scheduler.schedule().num_steps == 8  # nothing measured yet
    scheduler.observe_decode(seconds=30.0, steps=8)  # a call that compiled: alone it paces one step a call
    assert scheduler.schedule().num_steps == 1
    for _ in range(3):  # then steady steps of which 3 fit in a burst: the median forgets the outlier
        scheduler.observe_decode(seconds=8 * STREAM_BURST_SECONDS / 3.5, steps=8)
    assert scheduler.schedule().num_steps == 3


def test_a_chained_call_reserves_pages_for_both_calls():
    """Async scheduling: the call behind one in flight holds pages for the positions both can reach."""
    blocks = BlockManager(64, PAGE, "model")
    scheduler = Scheduler(SchedulerConfig(4, 64, 4, decode_steps=4), blocks)
    scheduler.running = [decoding(blocks, "a", 6), decoding(blocks, "b", 6)]
    flight = scheduler.schedule()  # positions 5..8 of each
    chained = scheduler.chain(flight)
    assert chained is not None and chained.num_steps == 4 and chained.all_decode
    assert [row.start for row in chained.decodes] == [9, 9]  # placeholders: where the flight would leave them
    assert all(len(row.request.pages) == blocks.pages_for(5 + 8) for row in chained.decodes)  # positions <= 12


def test_no_call_is_chained_when_the_next_one_needs_the_landed_tokens():
    blocks = BlockManager(64, PAGE, "model")
    scheduler = Scheduler(SchedulerConfig(4, 64, 4, decode_steps=4), blocks)
    scheduler.running = [decoding(blocks, "a", 6), decoding(blocks, "b", 6, max_tokens=3)]
    flight = scheduler.schedule()
    scheduler.add(Request("c", 0, None, [3, 4, 5], SamplingParams(max_tokens=4), 0, ()))
    assert scheduler.chain(flight) is None  # "c" can be admitted once the flight lands
    scheduler.waiting.clear()
    assert scheduler.chain(flight, least_steps=5) is None  # a GPU's one-step call is not chained
    scheduler.running[0].params = SamplingParams(max_tokens=5)  # "a" ends within the flight too (at 10 tokens)
    assert scheduler.chain(flight) is None  # nobody decodes past the flight


def test_a_short_pool_chains_nothing_rather_than_preempt():
    scheduler = full_pool_scheduler(num_tokens=6)
    flight = scheduler.schedule()
    assert scheduler.chain(flight) is None and scheduler.num_preemptions == 0


def waiting(name: str, num_tokens: int) -> Request:
    """A new request of num_tokens prompt tokens."""
    return Request(name, 0, None, list(range(3, 3 + num_tokens)), SamplingParams(max_tokens=8), 0, ())


def test_a_burst_of_short_prompts_prefills_in_one_step_as_the_budget_allows():
    # vLLM's behaviour: no cap on prompts per step beyond max_num_seqs and the token budget, so a
    # burst's last request does not wait a step per few prompts for its first token.
    blocks = BlockManager(64, PAGE, "model", prefix_caching=False)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=40), blocks)
    for i in range(10):
        scheduler.add(waiting(f"r{i}", 5))
    first = scheduler.schedule()
    assert [row.count for row in first.prefills] == [5] * 8  # max_num_seqs binds: 8 of 10
    capped = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=12, max_prefill_seqs=4),
                       BlockManager(64, PAGE, "model", prefix_caching=False))
    for i in range(10):
        capped.add(waiting(f"r{i}", 5))
    assert [row.count for row in capped.schedule().prefills] == [5, 5, 2]  # the budget binds, chunking the third
    capped.config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_prefill_seqs=2)
    assert len(capped.schedule().prefills) == 2  # the knob still caps when set: the chunked one and one new
