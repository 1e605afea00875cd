"""The device-call cycle behind `LLMEngine.step`: start a call, chain one behind it, land it and
advance its requests, or fail its requests alone when it breaks.

A base class of `LLMEngine` (as vLLM splits its runner into mixins): it works on the engine's
state, declared below, and keeps the call lifecycle apart from request intake and outputs.
Nothing here calls jax.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from jaxinfer.config.buckets import bucket
from jaxinfer.config.engine import EngineConfig
from jaxinfer.engine.block_manager import BlockManager
from jaxinfer.engine.in_flight import InFlight
from jaxinfer.engine.metrics import EngineMetrics, StepClock
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Schedule, Scheduler
from jaxinfer.engine.speculation import EngineDraft, Speculator
from jaxinfer.engine.speculation_accounting import DecodeTime, observe_drafts, record_decode_time
from jaxinfer.engine.step_accounting import decode_iterations, token_slots
from jaxinfer.engine.step_apply import advance_request
from jaxinfer.engine.step_builder import build_chained_step, build_step, build_verify_step, landed_rows
from jaxinfer.engine.structured import StructuredOutputs
from jaxinfer.runtime.host_step import HostStep

if TYPE_CHECKING:
    from jaxinfer.checkpoint.tokenizer import TokenTexts
    from jaxinfer.runtime.engine_step import StepOutputs
    from jaxinfer.runtime.model_runner import ModelRunner

log = logging.getLogger(__name__)


class StepCalls:
    """Starting, chaining, landing and failing the engine's device calls (see `LLMEngine.step`)."""

    runner: "ModelRunner"
    config: EngineConfig
    scheduler: Scheduler
    blocks: BlockManager
    speculator: Speculator | None
    draft_spec: EngineDraft | None
    structured: StructuredOutputs
    stats: EngineMetrics
    token_texts: "TokenTexts"
    model_identity: str
    in_flight: InFlight | None  # the device call started and not yet landed
    chained: InFlight | None  # inside step(): the call started behind in_flight (async_scheduling)

    def _chain(self, clock: StepClock) -> set[str]:
        """Start the next all-decode call behind the one in flight, if its rows go on decoding (it
        becomes `chained`): a verify call where the device drafts them from where the call in flight
        leaves them and the plan drafts, else a multi-step decode call if the plan declines them
        whatever lands; the requests a failed start failed."""
        flight, config = self.in_flight, self.config
        if flight is None or not (config.async_scheduling and config.overlap_outputs):
            return set()
        if not (flight.host.decode or (flight.host.drafts is not None and self._drafts_on_device())):
            return set()
        # A GPU's fixed-trip decode runs all its iterations: one step goes through the ragged program.
        least_steps = 1 if self.runner.stop_early else 2
        verify = self._verify_next(flight)
        schedule = None
        if verify or self._plain_next(flight):
            reach = self.scheduler.config.lookahead if verify else 0
            schedule = self.scheduler.chain(flight.schedule, least_steps, self._flight_reach(flight), reach)
        clock.lap("schedule")
        if schedule is None:
            return set()
        host = (self._chained_verify(schedule) if verify else None) or build_chained_step(schedule, config)
        # Rows whose mask is fixed (allowed_token_ids) chain too: every carried row samples.
        host.bitmask = self.structured.bitmask_for(landed_rows(schedule), host)
        clock.lap("build")
        try:
            self.move_pages()
            packed = self.runner.dispatch(host, clock.lap)
        except Exception as error:  # as in _launch; the call in flight ran on the pools this rebuilds
            log.exception("engine step failed; its requests are failed, the rest recompute")
            return self._fail_step(host, error)
        self.chained = InFlight(schedule, host, packed, time.perf_counter(), clock.laps.get("dispatch", 0.0), True,
                                self._measuring(host))
        self.stats.engine_chained_calls += 1
        self.stats.engine_chained_verify_calls += host.drafts is not None
        clock.chained = True
        return set()

    def _drafts_on_device(self) -> bool:
        """True when a draft model, an EAGLE head or the device's lookup drafts (nothing on the host)."""
        return self.speculator is not None and not self.speculator.config.drafts_on_host

    def _flight_reach(self, flight: InFlight) -> int:
        """The most tokens the call in flight adds to a row: its decode steps, or a chunk per verify round."""
        host = flight.host
        return host.num_rounds * self.runner.verify_chunk if host.drafts is not None else host.num_steps

    @staticmethod
    def _unfinished(flight: InFlight) -> list[Request]:
        """The flight's requests still running (none finished since it was started)."""
        return [row.request for row in flight.schedule.decodes if not row.request.finished]

    def _going_on(self, flight: InFlight) -> list[Request]:
        """The flight's requests that go on decoding past it (those that reach max_tokens in it left out)."""
        return [r for r in self._unfinished(flight) if r.max_total - r.num_tokens > flight.host.num_steps]

    def _verify_next(self, flight: InFlight) -> bool:
        """Whether a verify call may start behind `flight` (its plan then decides: verify or plain):
        the device drafts its rows and they need no catch-up there (`Speculator.drafts_chained`),
        and `flight` does not measure acceptance (a plan before it lands would measure again)."""
        return (bool(self._going_on(flight)) and self._drafts_on_device() and not flight.measuring
                and self.speculator.drafts_chained(self._unfinished(flight), flight.host.drafts is not None))

    def _measuring(self, host: HostStep) -> bool:
        """Whether the verify call just planned measures acceptance (the plan's one-round calls)."""
        return host.drafts is not None and self.speculator.measuring

    def _chained_verify(self, schedule: Schedule) -> HostStep | None:
        """The verify call of a chained schedule, or None when its plan declines (the rows then decode
        plainly behind the flight); planned on the tokens landed so far: the device cuts each row's
        drafts to its max_tokens and looks them up or drafts them from where the flight leaves it."""
        requests = [row.request for row in schedule.decodes]
        drafts = self.speculator.plan(requests, bucket(len(requests)), schedule.lookahead - 1)
        if drafts is None:
            return None
        runner = self.runner
        rounds = 1 if self.speculator.measuring else runner.spec_rounds
        return build_verify_step(schedule, drafts, runner.verify_chunk, self.config.page_size, runner.width, rounds,
                                 carried=True)

    def _plain_next(self, flight: InFlight) -> bool:
        """Whether the call after `flight` decodes plainly: always without speculation, else when the
        speculation plan declines the rows that decode past `flight` (planned on the tokens known
        before it lands, and knowing whether a plan on landed tokens just declined `flight`'s rows;
        rows that reach max_tokens in it, e.g. a penalized request that keeps the others plain, are
        left out)."""
        if self.speculator is None:
            return True
        requests = self._going_on(flight)
        just_declined = not flight.carried and flight.host.drafts is None
        return bool(requests) and self.speculator.declines(requests, bucket(len(requests)), just_declined)

    def _launch(self, clock: StepClock) -> set[str]:
        """Schedule and start the next device call (it stays in flight); the requests a failed start failed."""
        schedule = self.scheduler.schedule()
        clock.lap("schedule")
        if schedule.empty:
            return set()
        self._load_adapters()
        started = time.perf_counter()
        host = self._build(schedule)
        clock.lap("build")
        now = time.monotonic()
        for request in host.requests:
            if request is not None and request.timing.first_scheduled is None:
                request.timing.first_scheduled = now
        try:
            self.move_pages()
            packed = self.runner.dispatch(host, clock.lap)
        except Exception as error:  # a failed program must not take the other requests down
            log.exception("engine step failed; its requests are failed, the rest recompute")
            return self._fail_step(host, error)
        self.in_flight = InFlight(schedule, host, packed, started, clock.laps.get("dispatch", 0.0),
                                  measuring=self._measuring(host))
        return set()

    def move_pages(self) -> None:
        """Make the page copies the block manager queued (its host tier), before the next device call:
        evicted pages out to the host store first (a page evicted and reused is saved before anything
        writes it), then the pages found there back into the pool."""
        blocks = self.blocks
        if blocks.host is None or not (blocks.offloads or blocks.uploads):
            return
        offloads, uploads = blocks.take_moves()
        copies = self.runner.offload_pages([page for page, _ in offloads]) if offloads else []
        if uploads:
            pages = list(uploads)
            tokens = np.asarray([uploads[page][1] for page in pages], np.int32)
            self.runner.load_pages(pages, [uploads[page][0] for page in pages], tokens)
            blocks.host.loaded_pages += len(pages)
        for (_, page_hash), copy in zip(offloads, copies):
            blocks.host.put(page_hash, copy)

    def _land(self, clock: StepClock) -> set[str]:
        """Wait for the call in flight, if any, and apply its tokens; the requests it touched."""
        flight, self.in_flight = self.in_flight, None
        if flight is None:
            return set()
        try:
            out = self.runner.read(flight.packed)
            clock.lap("outputs")
        except Exception as error:
            log.exception("engine step failed; its requests are failed, the rest recompute")
            return self._fail_step(flight.host, error)
        if self.chained is not None:  # the device turns to it now: its time runs from here
            self.chained.started = time.perf_counter()
        device_seconds = flight.dispatch_seconds + clock.laps["outputs"]
        schedule = landed_rows(flight.schedule) if flight.carried else flight.schedule
        touched = self._apply_outputs(schedule, flight.host, out, flight.started, device_seconds)
        clock.lap("apply")
        return touched

    def _build(self, schedule: Schedule) -> HostStep:
        """The step's arrays, with the structured-output masks of its constrained rows."""
        host = self._build_step(schedule)
        host.bitmask = self.structured.bitmask_for(landed_rows(schedule), host)
        return host

    def _build_step(self, schedule: Schedule) -> HostStep:
        """A verify step when the batch is all decodes and some row drafts, else the plain step."""
        if schedule.all_decode and self.speculator is not None:
            requests = [row.request for row in schedule.decodes]
            # A row's drafts are written at once, so they must fit the pages the scheduler reserved.
            drafts = self.speculator.plan(requests, bucket(len(requests)), schedule.lookahead - 1)
            if drafts is not None:
                runner = self.runner
                # A mask that changes per token holds for one round: later rounds' drafts are unknown here.
                # A fixed one (allowed_token_ids, one-token bad words) is every round's.
                one_round = self.speculator.measuring or any(r.masked_per_token for r in requests)
                rounds = 1 if one_round else runner.spec_rounds
                return build_verify_step(schedule, drafts, runner.verify_chunk, self.config.page_size, runner.width,
                                         rounds)
        host = build_step(schedule, self.config, fixed_trips=not self.runner.stop_early)
        if self.speculator is not None:  # its rows decode at the bucket of every running request
            host.draft_reads = self.speculator.reads_prompts(bucket(len(self.scheduler.running)))
        return host

    def _apply_outputs(
        self, schedule: Schedule, host: HostStep, out: "StepOutputs", started: float, device_seconds: float
    ) -> set[str]:
        """Apply a landed call's outputs and account for it; the requests it touched."""
        if host.drafts is not None:
            observe_drafts(self.speculator, self.stats, schedule, host, out)
        elif self.speculator is not None and self.speculator.declined:
            produced = [(r, out.tokens[i, : out.counts[i]]) for i, r in enumerate(host.requests) if r is not None]
            self.speculator.observe_plain(produced)
        touched = self._apply(schedule, host, out)
        self.stats.record_padding(*token_slots(schedule, host, out, self.runner.stop_early, self.runner.verify_chunk))
        self.stats.record_inputs(self.runner.input_bytes)
        seconds = time.perf_counter() - started
        if self.speculator is not None and not schedule.prefills:
            record_decode_time(self.speculator, host, out, DecodeTime(
                bucket(len(schedule.decodes)), seconds, device_seconds, self.runner.stop_early,
                self.runner.spec_rounds, self.draft_spec is not None))
        if host.decode:
            self.scheduler.observe_decode(seconds, decode_iterations(host, out, self.runner.stop_early))
        return touched

    def _apply(self, schedule: Schedule, host: HostStep, out: "StepOutputs") -> set[str]:
        """Advance each row's request by what the step computed; finish and free those that ended."""
        now, touched = time.monotonic(), set()
        rows = {id(row.request): row for row in schedule.decodes + schedule.prefills}
        for r, request in enumerate(host.requests):
            if request is None or request.finished:  # finished: aborted while its call was in flight
                continue
            row = rows[id(request)]
            try:
                read_before = request.draft_computed
                produced = advance_request(request, row, out, r, host, self.token_texts)
                if self.draft_spec is not None:
                    self.blocks.mark_draft_read(request.pages, read_before, request.draft_computed)
            except Exception as error:  # e.g. a tokenizer failure: this request alone fails
                log.exception("request %s failed", request.request_id)
                request.finish("error")
                request.error = f"{type(error).__name__}: {error}"
                produced = 0
            self.stats.record_tokens(request, produced, now)
            if produced or request.finished:
                touched.add(request.request_id)
            full = request.num_computed // self.config.page_size
            if full > len(request.page_hashes):  # a page filled up: publish it for prefix caching
                self.blocks.register(request.cache_ids, request.pages, request.page_hashes, full, request.adapter)
            if request.finished:  # its pages stay cached, the last call's too (a next turn starts with them)
                self.scheduler.remove(request)
                self._record_finished(request)
        return touched

    def _fail_step(self, host: HostStep, error: Exception) -> set[str]:
        """Fail the step's requests, rebuild the (possibly consumed) pool, recompute everyone else; a
        call still in flight, or started behind it, ran on that pool and is dropped (its requests
        are the step's)."""
        self.in_flight = self.chained = None
        touched = set()
        for request in host.requests:
            if request is not None and not request.finished:
                self._fail_request(request, error)
                touched.add(request.request_id)
        self.scheduler.preempt_all()
        self._reset_blocks()
        self.runner.reset_pools()
        return touched

    def _load_adapters(self) -> None:
        """Write the LoRA adapters newly admitted requests run with into their device slots."""
        if self.scheduler.adapters is not None:
            for slot, name in self.scheduler.adapters.take_loads().items():
                self.runner.load_adapter(slot, name)

    def _reset_blocks(self) -> None:
        """A fresh block manager (no cached prefixes) over the same pool size."""
        self.blocks = BlockManager(
            self.blocks.num_pages, self.config.page_size, self.model_identity, self.config.enable_prefix_caching,
            spread=self.blocks.spread, host=self.blocks.host,
        )
        self.scheduler.blocks = self.blocks

    def _record_finished(self, request: Request) -> None:
        """Count a request that ended (any reason) in the metrics and the speculation totals."""
        self.stats.record_finished(request)
        if self.speculator is not None:
            self.speculator.totals.count_request()

    def _fail_request(self, request: Request, error: Exception) -> None:
        """End a request with `error`, freeing its pages, unless it already ended; its output carries the error."""
        if not request.finished:
            self.scheduler.remove(request)
            request.finish("error")
            self._record_finished(request)
        request.error = f"{type(error).__name__}: {error}"
