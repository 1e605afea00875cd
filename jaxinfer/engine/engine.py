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

import numpy as np

from jaxinfer.checkpoint.tokenizer import Detokenizer, TokenTexts
from jaxinfer.config.buckets import bucket
from jaxinfer.config.engine import EngineConfig
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.block_manager import BlockManager
from jaxinfer.engine.metrics import EngineMetrics, StepClock, snapshot
from jaxinfer.engine.output_processor import append_token, delta_output
from jaxinfer.engine.outputs import RequestOutput
from jaxinfer.engine.prompt_checks import check_logit_bias, check_prompt, check_stop_ids, encode_prompt
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Schedule, Scheduler, SchedulerConfig
from jaxinfer.engine.speculation import EngineDraft, Speculator, zero_counts
from jaxinfer.engine.step_accounting import decode_iterations, ran_rounds, token_slots
from jaxinfer.engine.step_builder import build_step, build_verify_step, profile_steps, warmup_steps
from jaxinfer.engine.step_costs import spread_host_share
from jaxinfer.engine.structured import StructuredOutputs
from jaxinfer.runtime.host_step import HostStep, caught_up
from jaxinfer.sampling.logprob import position_logprobs
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
                self.stats.record_finished(request)
                self.pending.add(request_id)

    def finish_aborted(self, request_ids: Sequence[str]) -> list[RequestOutput]:
        """The final outputs of these aborted requests now, without running a step.

        Only these: other requests (another caller's streams) neither step nor lose their outputs.
        """
        done = self.pending.intersection(request_ids)
        self.pending -= done
        return self._collect(done, final_only=False)

    def has_unfinished(self) -> bool:
        """True while any request has output left to deliver."""
        return bool(self.groups)

    def step(self, final_only: bool = False) -> list[RequestOutput]:
        """Run one scheduled batch; deltas for every request that progressed or finished.

        final_only (vLLM's FINAL_ONLY output kind, for every request of this step; add_request
        sets it per request): outputs only for the requests that finished, each whole (all that
        no earlier step returned), and no per-step deltas built for the others.
        """
        clock = StepClock()
        schedule = self.scheduler.schedule()
        touched, self.pending = self.pending, set()
        if schedule.empty:
            return self._collect(touched, final_only)
        clock.lap("schedule")
        started = time.perf_counter()
        host = self._build(schedule)
        clock.lap("build")
        outputs = self._collect(touched | self._run_and_apply(schedule, host, started, clock), final_only)
        clock.lap("collect")
        self.stats.record_step(clock)
        return outputs

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
        """Compile every step shape the knobs allow (default sampling variant); returns how many were compiled.

        Padding-only batches run through each program, so nothing is written to the cache.
        `progress` shows a bar on stderr (a serve start compiles a hundred or more programs).
        threads: programs compiled at once (default 1 on CPU, else up to 8; see engine/warmup.py).
        on_program(done, total) is called as programs are compiled (a server reports it on /health).
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
        self.blocks.reset_prefix_cache()

    def release(self) -> None:
        """Free the page pool (and forget cached prefixes); it is re-made on the next step."""
        if self.scheduler.running or self.scheduler.waiting:
            raise RuntimeError("release() with requests in flight; abort them first")
        self.runner.release()
        self._reset_blocks()

    def _run_and_apply(self, schedule: Schedule, host: HostStep, started: float, clock: StepClock) -> set[str]:
        """The requests the step touched; the clock's laps cover the call, its outputs and applying them."""
        now = time.monotonic()
        for request in host.requests:
            if request is not None and request.timing.first_scheduled is None:
                request.timing.first_scheduled = now
        try:
            out = self.runner.run(host, clock.lap)
            clock.lap("outputs")
        except Exception as error:  # a failed program must not take the other requests down
            log.exception("engine step failed; its requests are failed, the rest recompute")
            return self._fail_step(host, error)
        if host.drafts is not None:
            self._observe_drafts(schedule, host, out)
        elif self.speculator is not None and self.speculator.declined:
            produced = [(r, out.tokens[i, : out.counts[i]]) for i, r in enumerate(host.requests) if r is not None]
            self.speculator.observe_plain(produced)
        touched = self._apply(schedule, host, out)
        self.stats.record_padding(*token_slots(schedule, host, out, self.runner.stop_early, self.runner.verify_chunk))
        self.stats.record_inputs(self.runner.input_bytes)
        seconds = time.perf_counter() - started
        self._time_decode_step(schedule, host, out, seconds, sum(clock.laps.get(p, 0.0) for p in StepClock.DEVICE))
        if host.decode:
            self.scheduler.observe_decode(seconds, decode_iterations(host, out, self.runner.stop_early))
        clock.lap("apply")
        return touched

    def _time_decode_step(
        self, schedule: Schedule, host: HostStep, out: "StepOutputs", seconds: float, device_seconds: float
    ) -> None:
        """An all-decode step's time (scheduling to applied outputs) for the speculation plan, per decode
        step or verify round. The host's share is spread over the steps or rounds the call was planned
        to run: a measuring verify call runs one round, the ones it prices run spec_rounds."""
        speculator = self.speculator
        if speculator is None or schedule.prefills:
            return
        rows = bucket(len(schedule.decodes))
        plain = host.drafts is None
        ran = decode_iterations(host, out, self.runner.stop_early) if plain else ran_rounds(out)
        if plain:
            speculator.count_plain(rows, ran)
        if speculator.measured is None:
            return
        planned = host.num_steps if plain else self.runner.spec_rounds
        seconds = spread_host_share(seconds, device_seconds, ran, planned)
        if plain:
            speculator.measured.record_plain(rows, seconds, ran)
        else:
            draft_steps = int(np.max(host.num_drafts)) if self.draft_spec is not None else 0
            speculator.measured.record_verify(rows, seconds / ran, draft_steps)

    def _observe_drafts(self, schedule: Schedule, host: HostStep, out: "StepOutputs") -> None:
        """Acceptance per row and round into the speculator and the vLLM-named counters."""
        rows = len(schedule.decodes)
        requests = [row.request for row in schedule.decodes]
        for i in range(ran_rounds(out)):
            drafted, accepted = np.maximum(out.drafted[:rows, i], 0), np.asarray(out.accepted[:rows, i])
            self.speculator.observe(requests, drafted, accepted)
            self.stats.record_drafts(drafted, accepted, self.speculator.k_max)

    def _apply(self, schedule: Schedule, host: HostStep, out: "StepOutputs") -> set[str]:
        """Advance each row's request by what the step computed; finish and free those that ended."""
        now, touched = time.monotonic(), set()
        rows = {id(row.request): row for row in schedule.decodes + schedule.prefills}
        for r, request in enumerate(host.requests):
            if request is None:
                continue
            row = rows[id(request)]
            try:
                read_before = request.draft_computed
                produced = self._advance(request, row, out, r, host)
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
                self.stats.record_finished(request)
            else:
                full = request.num_computed // self.config.page_size
                if full > len(request.page_hashes):  # a page filled up: publish it for prefix caching
                    self.blocks.register(request.all_ids, request.pages, request.page_hashes, full)
        return touched

    def _advance(self, request: Request, row, out: "StepOutputs", r: int, host: HostStep) -> int:
        request.num_computed = row.start + row.count
        if host.drafts is None and not host.decode and request.draft_computed == row.start:
            request.draft_computed = request.num_computed  # a ragged step: a draft model read its tokens
        if not row.samples:
            return 0
        produced = self._append(request, out, r)
        if host.drafts is not None:  # the verify rounds' draft (model) read every position they computed...
            caught = caught_up(int(host.draft_start[r]), row.start)
            # ...unless its catch-up was cut short (CATCH_UP_SPAN positions a call): the rest comes next time
            request.draft_computed = request.num_computed if caught >= row.start else caught
        return produced

    def _append(self, request: Request, out: "StepOutputs", r: int) -> int:
        """Append row r's new tokens (and logprobs) until the request finishes; how many it took."""
        count = int(out.counts[r]) if out.tokens.shape[1] > 1 else 1
        per_token = bool(request.params.stop)  # a stop string can end the request at any token
        for j in range(count):
            if j:
                request.num_computed += 1
            if out.logprobs is not None and request.params.logprobs is not None:
                k = request.params.logprobs
                request.logprobs.append(position_logprobs(
                    int(out.tokens[r, j]), out.logprobs[r, j], int(out.ranks[r, j]), out.top_ids[r, j, :k].tolist(),
                    out.top_logprobs[r, j, :k].tolist(), self.token_texts,
                ))
            if append_token(request, int(out.tokens[r, j]), detokenize=per_token or j == count - 1):
                return j + 1
        return count

    def _fail_step(self, host: HostStep, error: Exception) -> set[str]:
        """Fail the step's requests, rebuild the (possibly consumed) pool, recompute everyone else."""
        touched = set()
        for request in host.requests:
            if request is not None and not request.finished:
                self.scheduler.remove(request)
                request.finish("error")
                request.error = f"{type(error).__name__}: {error}"
                self.stats.record_finished(request)
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

    def _collect(self, touched: set[str], final_only: bool) -> list[RequestOutput]:
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

