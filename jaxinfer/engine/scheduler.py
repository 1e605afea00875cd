"""Who runs next: a per-step token budget, decodes first, then prefill chunks; preemption by recompute.

Plain Python, no jax. Each scheduled row is (request, first position, token count): a decode
is one token, a prefill chunk up to the remaining budget (long prompts are split across
steps). A step's tokens are packed end to end (runtime/engine_step), so rows need no room beyond
their own tokens. When the batch is all decodes and nobody is waiting, one call may run several decode
steps; their pages are reserved first, and when the pool is short it runs fewer steps rather
than preempt anyone. When pages run out for a single step, the most recently admitted request
is preempted: its pages are released and it recomputes later, with identical output. Where an
image's tokens attend to each other both ways (Gemma 3), a chunk never ends inside an image; where the prompt is
one bidirectional prefix (PaliGemma's), one chunk holds all of it still to compute.

vLLM's scheduling policies: "fcfs" admits in arrival order (a preempted request first) and preempts
the latest admitted; "priority" admits by (priority, arrival), lower first, and preempts the running
request that comes last in that order, which may be the one that asked for pages.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import statistics

from jaxinfer.engine.adapter_slots import AdapterSlots
from jaxinfer.engine.block_manager import BlockManager, OutOfPages
from jaxinfer.engine.request import Request, Status
from jaxinfer.runtime.image_input import ImageInput

# A streamed request's tokens arrive at least this often while it decodes (stream_interval None):
# bursts shorter than this read as smooth text, and longer calls save host round trips.
STREAM_BURST_SECONDS = 0.05
PACE_WINDOW = 16  # recent all-decode calls whose median step time paces streams


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one step."""

    max_num_seqs: int = 64  # rows of a step
    max_num_batched_tokens: int = 512  # tokens of a step (decodes + prefill chunks)
    max_prefill_seqs: int | None = None  # prompts chunked in one step (None: up to max_num_seqs)
    decode_steps: int = 8  # decode steps one call may run when the batch is all decodes
    lookahead: int = 1  # tokens an all-decode call may add per row (decode steps, or drafts + 1)
    stream_interval: int | None = None  # decode steps a call may run while a streamed request is in it (None: paced)
    whole_images: bool = False  # a prefill chunk never ends inside an image (Gemma 3's attend both ways)
    by_priority: bool = False  # vLLM's scheduling_policy "priority" (False: "fcfs")


@dataclasses.dataclass
class Row:
    """One request's share of a step: tokens all_ids[start : start + count]."""

    request: Request
    start: int
    count: int

    @property
    def samples(self) -> bool:
        """True when the step computes the last known token, so it yields the next one."""
        return self.start + self.count == self.request.num_tokens


@dataclasses.dataclass
class Schedule:
    """A step's rows (decodes first) and how many decode steps the call may run."""

    decodes: list[Row]
    prefills: list[Row]
    num_steps: int = 1
    all_decode: bool = False  # nothing to prefill or admit: rows may take `lookahead` tokens (pages reserved)
    lookahead: int = 1  # tokens past its last one that every decode row's pages hold (drafts fit in lookahead - 1)

    @property
    def empty(self) -> bool:
        """True when nothing can run."""
        return not self.decodes and not self.prefills


class Scheduler:
    """Waiting and running queues over one block manager."""

    def __init__(self, config: SchedulerConfig, blocks: BlockManager, adapters: AdapterSlots | None = None):
        self.config = config
        self.blocks = blocks
        self.adapters = adapters  # the device's LoRA adapter slots (None: served without adapters)
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        # Counters live here, not in the block manager, which the engine replaces after a failed step.
        # Decode steps that take about STREAM_BURST_SECONDS (the engine paces it from measured step
        # times): what a call with a streamed row runs when stream_interval is None.
        self.stream_steps = config.decode_steps
        self._step_seconds: collections.deque[float] = collections.deque(maxlen=PACE_WINDOW)  # recent decode steps
        self.num_preemptions = 0
        self.prefix_queries = 0  # prompt tokens of admitted requests looked up in the prefix cache
        self.prefix_hits = 0  # of which found

    def add(self, request: Request) -> None:
        """Queue a new request."""
        if self.config.by_priority:
            bisect.insort(self.waiting, request, key=priority_order)
        else:
            self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Take a request out of the queues and free its pages (finish or abort)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._free(request)

    def schedule(self) -> Schedule:
        """Rows for the next step."""
        all_decode = self._steady()
        reserve = self._affordable_lookahead(max(self.config.decode_steps, self.config.lookahead)) if all_decode else 1
        decodes = self._schedule_decodes(reserve)
        budget = self.config.max_num_batched_tokens - len(decodes)
        prefills = self._schedule_prefills(budget, decodes)
        if not (all_decode and not prefills):
            return Schedule(decodes, prefills)
        return Schedule(decodes, prefills, min(reserve, self._decode_steps(decodes)), True, reserve)

    def chain(self, flight: Schedule, least_steps: int = 1, ahead: int | None = None,
              reach: int = 0) -> Schedule | None:
        """The all-decode call to start behind `flight`, an all-decode call not landed yet, on the
        tokens and lengths the device carries (asynchronous scheduling); None when the next call
        needs what it returns first.

        Its rows are the flight's requests still running, at the positions they reach if the flight
        adds `ahead` tokens to each (default its decode steps; a verify call's most; placeholders:
        the device knows where they are), with pages reserved for both calls: the chained call's
        decode steps, or `reach` tokens where more (a verify call's rounds). None when someone may
        be admitted, a row is constrained (its mask needs its tokens), the running requests changed,
        every row may end within the flight, or the pool cannot hold both calls' tokens without
        preempting anyone; also when the call would run fewer than least_steps steps (a GPU's
        fixed-trip decode runs all its iterations for one).
        """
        requests = [row.request for row in flight.decodes if not row.request.finished]
        ahead = flight.num_steps if ahead is None else ahead
        if not (flight.all_decode and self._steady() and self._only_running(requests)):
            return None
        if any(r.masked_per_token for r in requests) or all(r.max_total - r.num_tokens <= ahead for r in requests):
            return None
        rows = [Row(r, r.num_tokens - 1 + ahead, 1) for r in requests]
        steps = self._decode_steps(rows)
        room = max(steps, reach)
        if steps < least_steps or pages_to_reserve(requests, ahead + room, self.blocks) > self.blocks.usable_pages:
            return None
        for request in requests:
            need = self.blocks.pages_for(min(request.num_tokens - 1 + ahead + room, request.max_total))
            request.pages += self.blocks.allocate(max(0, need - len(request.pages)), _last(request.pages))
        return Schedule(rows, [], steps, True, room)

    def _only_running(self, requests: list[Request]) -> bool:
        """True when `requests` are exactly the running ones (none admitted or preempted since)."""
        return {id(r) for r in requests} == {id(r) for r in self.running}

    def _steady(self) -> bool:
        """True when nobody can be admitted and nobody prefills: the running requests all decode."""
        admissible = bool(self.waiting) and len(self.running) < self.config.max_num_seqs and self._head_fits()
        return not admissible and not any(r.prefilling for r in self.running)

    def observe_decode(self, seconds: float, steps: int) -> None:
        """An all-decode call of `steps` steps took `seconds` (dispatch to applied outputs): paces streams."""
        self._step_seconds.append(seconds / max(steps, 1))
        step = statistics.median(self._step_seconds)  # a call that compiled, or a stall, is an outlier
        self.stream_steps = max(1, min(self.config.decode_steps, int(STREAM_BURST_SECONDS / step)))

    def _decode_steps(self, decodes: list[Row]) -> int:
        """Decode steps the call may run: one when a row's mask changes with each token (a structured-output
        constraint's or multi-token bad words': the host makes it for one token; allowed_token_ids and one-token
        bad words hold one mask for every step), at most stream_interval (None: stream_steps) when someone watches a
        row's tokens arrive (a stream gets them in bursts of a call's steps), else decode_steps."""
        if any(row.request.masked_per_token for row in decodes):
            return 1
        if any(row.request.streamed for row in decodes):
            interval = self.config.stream_interval or self.stream_steps
            return min(self.config.decode_steps, interval)
        return self.config.decode_steps

    def _affordable_lookahead(self, most: int) -> int:
        """The most tokens (up to `most`) every running row can reserve pages for without preempting
        anyone; 1 when not even one fits (that single step then preempts).

        Several steps in one call save host round trips; preempting a request to get them costs
        its whole recompute. The step count is an input of the multi-step program, not a static
        argument, so fewer steps compile nothing new.
        """
        free = self.blocks.usable_pages
        if pages_to_reserve(self.running, most, self.blocks) <= free:
            return most
        fits, short = 1, most  # the answer is in [fits, short)
        while short - fits > 1:
            middle = (fits + short) // 2
            if pages_to_reserve(self.running, middle, self.blocks) <= free:
                fits = middle
            else:
                short = middle
        return fits

    def _head_fits(self) -> bool:
        """Whether the pool has room for the next waiting request's first chunk (cached pages not counted)."""
        head = self.waiting[0]
        first_chunk = min(head.num_tokens, self.config.max_num_batched_tokens)
        return head.ready and self.blocks.usable_pages >= self.blocks.pages_for(first_chunk)

    def _schedule_decodes(self, steps: int) -> list[Row]:
        rows, i = [], 0
        while i < len(self.running):
            request = self.running[i]
            if request.prefilling:
                i += 1
                continue
            need = self.blocks.pages_for(min(request.num_tokens - 1 + steps, request.max_total))
            if not self._grow(request, need, rows):
                continue  # request itself was preempted
            rows.append(Row(request, request.num_tokens - 1, 1))
            i += 1
        return rows

    def _schedule_prefills(self, budget: int, decodes: list[Row]) -> list[Row]:
        rows: list[Row] = []
        most = self.config.max_prefill_seqs or self.config.max_num_seqs
        for request in [r for r in self.running if r.prefilling]:
            count = min(request.num_tokens - request.num_computed, budget)
            if count <= 0 or len(rows) >= most:
                return rows
            count = self._chunk(request, request.num_computed, count)
            if count <= 0:  # its next image does not fit in what is left of this step
                continue
            need = self.blocks.pages_for(request.num_computed + count)
            if request.status is Status.RUNNING and self._grow(request, need, decodes + rows):
                rows.append(Row(request, request.num_computed, count))
                budget -= count
        while self.waiting and budget > 0 and len(rows) < most:
            if len(self.running) >= self.config.max_num_seqs or not self.waiting[0].ready:
                break
            row = self._admit(self.waiting[0], budget)
            if row is None:
                break
            self.waiting.popleft()
            self.running.append(row.request)
            rows.append(row)
            budget -= row.count
        return rows

    def _admit(self, request: Request, budget: int) -> Row | None:
        """Give a waiting request its cached prefix and pages for a first chunk (and its LoRA adapter
        a slot), or None if they do not fit."""
        if request.adapter is not None:
            slot = self.adapters.acquire(request.adapter)
            if slot is None:
                return None
            request.adapter_slot = slot
        pages, hashes = self.blocks.match_prefix(request.cache_ids, request.adapter)
        computed = len(pages) * self.blocks.page_size
        count = self._chunk(request, computed, min(request.num_tokens - computed, budget))
        if count <= 0:  # its next image does not fit in what is left of this step: it waits for one that has room
            self.blocks.release(pages)
            self._release_adapter(request)
            return None
        try:
            pages += self.blocks.allocate(self.blocks.pages_for(computed + count) - len(pages), _last(pages))
        except OutOfPages:
            self.blocks.release(pages)
            self._release_adapter(request)
            return None
        if self.blocks.prefix_caching:  # counted once admitted: a request that waits for pages retries each step
            self.prefix_queries += request.num_tokens
            self.prefix_hits += computed
        request.pages, request.page_hashes, request.num_computed = pages, hashes, computed
        if request.num_cached_tokens is None:  # as vLLM: the first admission's (a preempted request recomputes)
            request.num_cached_tokens = computed
        # Cached pages a draft has read need no catch-up, but the last of their positions: an EAGLE
        # head's output there read the token after it, which this request may not share.
        request.draft_computed = max(self.blocks.draft_read_prefix(pages) * self.blocks.page_size - 1, 0)
        request.status = Status.RUNNING
        return Row(request, computed, count)

    def _chunk(self, request: Request, start: int, count: int) -> int:
        """count, shortened where whole_images says so to end before the image it would cut, or a whole-prompt
        request's before its prompt's end (0: the chunk starts in that image or prompt and cannot hold the rest of
        it this step)."""
        if request.whole_prompt:
            count = whole_span_count([(0, len(request.prompt_ids))], start, count)
        return whole_image_count(request.images, start, count) if self.config.whole_images else count

    def _grow(self, request: Request, need: int, scheduled: list[Row]) -> bool:
        """Give request `need` pages in all, preempting others not scheduled this step (`_victim`).

        Returns False when the request itself had to be preempted.
        """
        while len(request.pages) < need:
            try:
                request.pages += self.blocks.allocate(need - len(request.pages), _last(request.pages))
            except OutOfPages:
                victim = self._victim(request, scheduled)
                self._preempt(victim)
                if victim is request:
                    return False
        return True

    def _victim(self, request: Request, scheduled: list[Row]) -> Request:
        """Whom to preempt so that `request` grows: a running request not scheduled this step, the latest
        admitted (fcfs) or the last in priority order, `request` itself included (priority)."""
        taken = {id(row.request) for row in scheduled} | {id(request)}
        others = [r for r in self.running if id(r) not in taken]
        if self.config.by_priority:
            return max([*others, request], key=priority_order)
        return others[-1] if others else request

    def preempt_all(self) -> None:
        """Send every running request back to waiting (it recomputes)."""
        for request in reversed(self.running[:]):
            self._preempt(request)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._free(request)
        request.status = Status.WAITING
        if self.config.by_priority:
            bisect.insort(self.waiting, request, key=priority_order)
        else:
            self.waiting.appendleft(request)
        self.num_preemptions += 1

    def _free(self, request: Request) -> None:
        self.blocks.release(request.pages)
        request.pages, request.page_hashes, request.num_computed = [], [], 0
        self._release_adapter(request)

    def _release_adapter(self, request: Request) -> None:
        if request.adapter_slot >= 0:
            self.adapters.release(request.adapter_slot)
            request.adapter_slot = -1


def pages_to_reserve(requests: list[Request], lookahead: int, blocks: BlockManager) -> int:
    """New pages the decoding requests need to hold `lookahead` more tokens each (never past max_tokens)."""
    return sum(
        max(0, blocks.pages_for(min(r.num_tokens - 1 + lookahead, r.max_total)) - len(r.pages)) for r in requests
    )


def priority_order(request: Request) -> tuple[int, float]:
    """A request's place under the "priority" policy: lower priority values first, then earlier arrivals."""
    return request.priority, request.timing.arrival


def whole_image_count(images: tuple[ImageInput, ...], start: int, count: int) -> int:
    """Tokens of a chunk [start, start + count) once it ends before any image it would cut: an image's tokens
    see each other both ways, so all of an image's tokens still to compute go in one chunk (as vLLM schedules)."""
    spans = [(image.offset, image.offset + image.length) for image in images if image.rows is None]  # given: causal
    return whole_span_count(spans, start, count)


def whole_span_count(spans: list[tuple[int, int]], start: int, count: int) -> int:
    """Tokens of a chunk [start, start + count) once it ends before any span [lo, hi) it would cut (at the span's
    start, or nothing where the chunk starts inside it)."""
    end = start + count
    for lo, hi in spans:
        if lo < end < hi:
            end = max(lo, start)
    return end - start


def _last(pages: list[int]) -> int | None:
    return pages[-1] if pages else None
