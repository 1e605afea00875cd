"""`LLMEngine`: continuous batching over the paged KV cache, on the host.

The scheduler, block manager and requests decide who runs; each `step` plans one padded batch
(a `HostStep`), has the `ModelRunner` (the device side: weights, pools, programs) run it, and
turns the new tokens into `RequestOutput` deltas. Nothing here calls jax.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Sequence

from jaxinfer.checkpoint.tokenizer import Detokenizer, TokenTexts
from jaxinfer.config.buckets import bucket
from jaxinfer.config.engine import EngineConfig
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.block_manager import BlockManager
from jaxinfer.engine.in_flight import InFlight
from jaxinfer.engine.metrics import EngineMetrics, StepClock, snapshot
from jaxinfer.engine.output_processor import catch_up_text, delta_output
from jaxinfer.engine.outputs import RequestOutput
from jaxinfer.engine.prompt_checks import check_logit_bias, check_prompt, check_stop_ids, encode_prompt
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Schedule, Scheduler, SchedulerConfig
from jaxinfer.engine.speculation import EngineDraft, Speculator, zero_counts
from jaxinfer.engine.speculation_accounting import DecodeTime, observe_drafts, record_decode_time
from jaxinfer.engine.step_accounting import decode_iterations, token_slots
from jaxinfer.engine.step_apply import advance_request
from jaxinfer.engine.step_builder import (
    build_chained_step,
    build_step,
    build_verify_step,
    landed_rows,
    profile_steps,
    warmup_steps,
)
from jaxinfer.engine.structured import StructuredOutputs
from jaxinfer.runtime.host_step import HostStep
from jaxinfer.speculative.config import SpeculativeConfig

if TYPE_CHECKING:
    from jaxinfer.runtime.engine_step import StepOutputs
    from jaxinfer.runtime.model_runner import ModelRunner

log = logging.getLogger(__name__)


class LLMEngine:
    """add_request / step / abort / has_unfinished over one model and one page pool."""

    def __init__(
        self,
        runner: "ModelRunner",
        tokenizer: Any | None,
        config: EngineConfig,
        model_identity: str = "",
        default_params: SamplingParams | None = None,
        speculative: SpeculativeConfig | None = None,
        draft: EngineDraft | None = None,
    ):
        """runner: the device side (weights, pools, programs), made for the same config and
        speculation; the engine plans steps for it and turns their outputs into RequestOutputs."""
        self.runner, self.tokenizer, self.config = runner, tokenizer, config
        self.model_config = runner.model_config
        self.draft_spec = draft
        self.speculator = None if speculative is None else Speculator(speculative, draft)
        self.default_params = default_params or SamplingParams()
        self.model_identity = model_identity
        num_pages = runner.allocate(self._profile_steps)
        self.blocks = BlockManager(num_pages, config.page_size, model_identity, config.enable_prefix_caching,
                                   spread=runner.spread_pages)
        k_max = 0 if speculative is None else speculative.num_speculative_tokens
        self.scheduler = Scheduler(
            SchedulerConfig(
                config.max_num_seqs, config.max_num_batched_tokens, config.max_prefill_seqs, config.decode_steps,
                lookahead=runner.spec_rounds * (k_max + 1), stream_interval=config.stream_interval,
            ),
            self.blocks,
        )
        self.groups: dict[str, list[Request]] = {}
        self.pending: set[str] = set()  # aborted requests whose final output is still to be sent
        self.final_only: set[str] = set()  # requests that want their whole output once, no deltas
        self.token_texts = TokenTexts(tokenizer)  # logprobs' decoded tokens
        # Compiled constraints and step masks; a constraint ends where the model's end-of-sequence ids may follow.
        self.structured = StructuredOutputs(tokenizer, self.model_config.vocab_size, self.model_config.eos_token_ids)
        self.stats = EngineMetrics()
        self.in_flight: InFlight | None = None  # the device call started and not yet landed
        self.chained: InFlight | None = None  # inside step(): the call started behind in_flight (async_scheduling)

    def add_request(
        self, request_id: str, prompt: str | Sequence[int], params: SamplingParams | None = None,
        final_only: bool = False, streamed: bool = False,
    ) -> None:
        """Queue a request (text or token ids); invalid ones raise here and never reach a step.

        final_only (vLLM's FINAL_ONLY output kind, what `LLM.generate` asks for): no deltas, only
        the whole output once the request finishes. streamed: someone reads its deltas as they come
        (a stream), so while it decodes each call runs at most `stream_interval` steps.
        """
        if request_id in self.groups:
            raise ValueError(f"request_id {request_id!r} is already in use; give each request a unique id")
        params = self.default_params if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        ids = encode_prompt(prompt, self.tokenizer)
        check_prompt(ids, params.max_tokens, self.model_config.vocab_size, self.config.max_seq_len)
        check_logit_bias(params.logit_bias, self.model_config.vocab_size)
        stop_ids = params.stop_ids(self.model_config.eos_token_ids)
        check_stop_ids(stop_ids, params.min_tokens)
        group: list[Request] = []
        for i in range(params.n):
            seed = (params.seed + i) % 2**63 if params.seed is not None else self.runner.shared_seed()
            request = Request(
                request_id, i, prompt if isinstance(prompt, str) else None, ids, params, seed, stop_ids,
                leader=group[0] if group else None,
                detokenizer=Detokenizer(self.tokenizer) if self.tokenizer is not None else None,
                grammar=self.structured.start(params),  # compiled (cached) here: a bad constraint raises before queueing
                streamed=streamed,
            )
            if self.speculator is not None:
                request.spec_counts = zero_counts(self.speculator.k_max)
            group.append(request)
        if params.prompt_logprobs is not None:
            group[0].prompt_logprobs = self.runner.prompt_logprobs(ids, params.prompt_logprobs, self.token_texts)
        self.groups[request_id] = group
        if final_only:
            self.final_only.add(request_id)
        for request in group:
            self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its pages; its final output comes from the next step."""
        for request in self.groups.get(request_id, []):
            if not request.finished:
                self.scheduler.remove(request)
                request.finish("abort")
                self._record_finished(request)
                self.pending.add(request_id)

    def finish_aborted(self, request_ids: Sequence[str]) -> list[RequestOutput]:
        """The final outputs of these aborted requests now, without running a step.

        Only these: other requests (another caller's streams) neither step nor lose their outputs.
        """
        done = self.pending.intersection(request_ids)
        self.pending -= done
        return self._collect(done, final_only=False)

    def has_unfinished(self) -> bool:
        """True while any request has output left to deliver (a call in flight for aborted requests
        only is landed by the next step, or `release`)."""
        return bool(self.groups)

    def step(self, final_only: bool = False) -> list[RequestOutput]:
        """Run one scheduled batch; deltas for every request that progressed or finished.

        With overlap_outputs (the default) the call first lands the device call the last step()
        started (waits for it, appends its tokens), then starts the next one, scheduled on what
        just landed, and only then detokenizes and builds the outputs of the landed call, while
        the device runs: each step() returns the outputs of the call before it. Without it a call
        starts and lands in the same step(). With async_scheduling too, when the call in flight is
        a multi-step decode whose rows go on decoding, the next call starts before it lands, on the
        tokens and lengths the device carries (`Scheduler.chain`): the device never waits for the
        host between such calls.

        final_only (vLLM's FINAL_ONLY output kind, for every request of this step; add_request
        sets it per request): outputs only for the requests that finished, each whole (all that
        no earlier step returned), and no per-step deltas built for the others.
        """
        clock = StepClock()
        touched, self.pending = self.pending, set()
        touched |= self._chain(clock)
        touched |= self._land(clock)
        self.in_flight, self.chained = self.chained, None
        if self.in_flight is None:
            touched |= self._launch(clock)
        if not self.config.overlap_outputs:
            touched |= self._land(clock)
        outputs = self._collect(touched, final_only)
        clock.lap("overlapped" if self.in_flight is not None else "collect")
        if any(phase in clock.laps for phase in StepClock.DEVICE):
            self.stats.record_step(clock)
        return outputs

    def _chain(self, clock: StepClock) -> set[str]:
        """Start the next multi-step decode call behind the one in flight, if its rows go on decoding
        plainly (it becomes `chained`); the requests a failed start failed."""
        flight, config = self.in_flight, self.config
        if flight is None or not (config.async_scheduling and config.overlap_outputs) or not flight.host.decode:
            return set()
        # A GPU's fixed-trip decode runs all its iterations: one step goes through the ragged program.
        least_steps = 1 if self.runner.stop_early else 2
        schedule = None if not self._plain_next(flight) else self.scheduler.chain(flight.schedule, least_steps)
        clock.lap("schedule")
        if schedule is None:
            return set()
        host = build_chained_step(schedule, config)
        clock.lap("build")
        try:
            packed = self.runner.dispatch(host, clock.lap)
        except Exception as error:  # as in _launch; the call in flight ran on the pools this rebuilds
            log.exception("engine step failed; its requests are failed, the rest recompute")
            return self._fail_step(host, error)
        self.chained = InFlight(schedule, host, packed, time.perf_counter(), clock.laps.get("dispatch", 0.0), True)
        self.stats.engine_chained_calls += 1
        clock.chained = True
        return set()

    def _plain_next(self, flight: InFlight) -> bool:
        """Whether the call after `flight` decodes plainly: always without speculation, else when the
        speculation plan declines the rows that decode past `flight` (planned on the tokens known
        before it lands; rows that reach max_tokens in it, e.g. a logprobs request that keeps the
        others plain, are left out)."""
        if self.speculator is None:
            return True
        going_on = [row.request for row in flight.schedule.decodes if not row.request.finished]
        requests = [r for r in going_on if r.max_total - r.num_tokens > flight.host.num_steps]
        return bool(requests) and self.speculator.declines(requests, bucket(len(requests)))

    def _launch(self, clock: StepClock) -> set[str]:
        """Schedule and start the next device call (it stays in flight); the requests a failed start failed."""
        schedule = self.scheduler.schedule()
        clock.lap("schedule")
        if schedule.empty:
            return set()
        started = time.perf_counter()
        host = self._build(schedule)
        clock.lap("build")
        now = time.monotonic()
        for request in host.requests:
            if request is not None and request.timing.first_scheduled is None:
                request.timing.first_scheduled = now
        try:
            packed = self.runner.dispatch(host, clock.lap)
        except Exception as error:  # a failed program must not take the other requests down
            log.exception("engine step failed; its requests are failed, the rest recompute")
            return self._fail_step(host, error)
        self.in_flight = InFlight(schedule, host, packed, started, clock.laps.get("dispatch", 0.0))
        return set()

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
        host.bitmask = self.structured.bitmask_for(schedule, host)
        return host

    def _build_step(self, schedule: Schedule) -> HostStep:
        """A verify step when the batch is all decodes and some row drafts, else the plain step."""
        if schedule.all_decode and self.speculator is not None:
            requests = [row.request for row in schedule.decodes]
            # A row's drafts are written at once, so they must fit the pages the scheduler reserved.
            drafts = self.speculator.plan(requests, bucket(len(requests)), schedule.lookahead - 1)
            if drafts is not None:
                runner = self.runner
                # A constrained row's mask holds for one round: later rounds' drafts are unknown here.
                one_round = self.speculator.measuring or any(r.grammar is not None for r in requests)
                rounds = 1 if one_round else runner.spec_rounds
                return build_verify_step(schedule, drafts, runner.verify_chunk, self.config.page_size, runner.width,
                                         rounds)
        return build_step(schedule, self.config, fixed_trips=not self.runner.stop_early)

    def metrics(self) -> dict:
        """vLLM-named counters, gauges and latency histograms (see engine.metrics)."""
        scheduler = self.scheduler
        prefix = (scheduler.prefix_queries, scheduler.prefix_hits)
        values = snapshot(
            self.stats, len(scheduler.running), len(scheduler.waiting), self.blocks.usage, prefix,
            scheduler.num_preemptions,
        )
        # Process-wide, for soak checks: no compile after the warm-up, device memory back to its baseline.
        values["compiled_programs"] = self.runner.compiled_programs()
        device_bytes = self.runner.device_bytes_in_use()
        if device_bytes is not None:
            values["device_memory_bytes_in_use"] = device_bytes
        return values

    def speculation_metrics(self) -> dict | None:
        """Acceptance totals of the engine's speculation (drafted, accepted, rates), or None when off."""
        return None if self.speculator is None else self.speculator.metrics()

    def warmup(
        self, progress: bool = False, threads: int | None = None, on_program: Callable[[int, int], None] | None = None
    ) -> int:
        """Compile every program the knobs allow (see `program_count`); returns how many were made ready.

        Programs are compiled (or loaded from the program store), not run, so nothing is written to
        the cache. `progress` shows a bar on stderr. threads: programs compiled at once (default one
        per core, up to 8; see runtime/warmup.py). on_program(done, total) is called as programs
        are made ready (a server reports it on /health).
        """
        return self.runner.warm_up(self.step_hosts(), progress, threads, on_program)

    def _profile_steps(self) -> list[HostStep]:
        """The steps whose programs hold the most activations (the runner sizes an accelerator's pool by them)."""
        return profile_steps(self.config, self._verify_chunk)

    @property
    def _verify_chunk(self) -> int | None:
        return None if self.speculator is None else self.runner.verify_chunk

    def step_hosts(self) -> list[HostStep]:
        """A padding-only step of every step program's shape (what `warmup` compiles, with the runner's own)."""
        return warmup_steps(self.config, self._verify_chunk)

    def program_count(self) -> int:
        """How many programs `warmup` compiles (steps, sampling-slot reset, prompt-logprobs passes)."""
        return len(self.runner.programs(self.step_hosts()))

    def reset_prefix_cache(self) -> None:
        """Drop all cached prefixes (e.g. before a benchmark or after changing weights)."""
        self.pending |= self._land(StepClock())  # a call in flight registers the pages it filled
        self.blocks.reset_prefix_cache()

    def release(self) -> None:
        """Free the page pool (and forget cached prefixes); it is re-made on the next step."""
        self.pending |= self._land(StepClock())  # e.g. the last call of aborted requests
        if self.scheduler.running or self.scheduler.waiting:
            raise RuntimeError("release() with requests in flight; abort them first")
        self.runner.release()
        self._reset_blocks()

    def _apply_outputs(
        self, schedule: Schedule, host: HostStep, out: "StepOutputs", started: float, device_seconds: float
    ) -> set[str]:
        """Apply a landed call's outputs and account for it; the requests it touched."""
        if host.drafts is not None:
            observe_drafts(self.speculator, self.stats, schedule, out)
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
            if request.finished:
                self.scheduler.remove(request)
                self._record_finished(request)
            else:
                full = request.num_computed // self.config.page_size
                if full > len(request.page_hashes):  # a page filled up: publish it for prefix caching
                    self.blocks.register(request.all_ids, request.pages, request.page_hashes, full)
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

    def _reset_blocks(self) -> None:
        """A fresh block manager (no cached prefixes) over the same pool size."""
        self.blocks = BlockManager(
            self.blocks.num_pages, self.config.page_size, self.model_identity, self.config.enable_prefix_caching,
            spread=self.blocks.spread,
        )
        self.scheduler.blocks = self.blocks

    def _catch_up_texts(self, touched: set[str]) -> None:
        """Detokenize what the touched requests' last call appended; a failure fails that request alone."""
        for request_id in touched:
            for request in self.groups[request_id]:
                try:
                    catch_up_text(request)
                except Exception as error:  # e.g. a tokenizer failure
                    log.exception("request %s failed", request.request_id)
                    self._fail_request(request, error)

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

    def _collect(self, touched: set[str], final_only: bool) -> list[RequestOutput]:
        self._catch_up_texts(touched)
        outputs = []
        order = {request_id: i for i, request_id in enumerate(self.groups)}
        for request_id in sorted(touched, key=order.__getitem__):
            group = self.groups[request_id]
            finished = all(r.finished for r in group)
            if finished or not (final_only or request_id in self.final_only):
                outputs.append(delta_output(group))  # all not yet returned: under final_only, the whole
            if finished:
                del self.groups[request_id]
                self.final_only.discard(request_id)
        return outputs

