"""`LLMEngine`: continuous batching over the paged KV cache, on the host.

The scheduler, block manager and requests decide who runs; each `step` plans one padded batch
(a `HostStep`), has the `ModelRunner` (the device side: weights, pools, programs) run it, and
turns the new tokens into `RequestOutput` deltas. The device-call cycle (start, chain, land,
fail) is `StepCalls`, its base class; this file is request intake, outputs and administration.
Nothing here calls jax.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from jaxinfer.checkpoint.tokenizer import Detokenizer, TokenTexts
from jaxinfer.config.engine import EngineConfig
from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.adapter_slots import AdapterSlots, adapter_metrics
from jaxinfer.engine.asleep import EngineAsleep
from jaxinfer.engine.block_manager import BlockManager
from jaxinfer.engine.host_kv_store import HostPageStore
from jaxinfer.engine.in_flight import InFlight
from jaxinfer.engine.metrics import EngineMetrics, StepClock, snapshot
from jaxinfer.engine.output_processor import catch_up_text, delta_output
from jaxinfer.engine.outputs import RequestOutput
from jaxinfer.engine.prompt_checks import (
    check_audio,
    check_images,
    check_logit_bias,
    check_priority,
    check_prompt,
    check_stop_ids,
    check_whole_prompt,
    encode_prompt,
)
from jaxinfer.engine.request import Request
from jaxinfer.engine.request_seeds import RequestSeeds
from jaxinfer.engine.scheduler import Scheduler, SchedulerConfig
from jaxinfer.engine.spec_counters import zero_counts
from jaxinfer.engine.speculation import EngineDraft, Speculator
from jaxinfer.engine.step_builder import profile_steps, warmup_steps
from jaxinfer.engine.step_calls import StepCalls
from jaxinfer.engine.structured import StructuredOutputs
from jaxinfer.runtime.audio_input import split_audio
from jaxinfer.runtime.host_step import HostStep
from jaxinfer.runtime.image_input import ImageInput
from jaxinfer.speculative.config import SpeculativeConfig

if TYPE_CHECKING:
    from jaxinfer.runtime.adapter_store import AdapterStore
    from jaxinfer.runtime.model_runner import ModelRunner

log = logging.getLogger(__name__)


class LLMEngine(StepCalls):
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
        self.seeds = RequestSeeds(config.seed, runner.shared_seed)  # for requests that give none
        self.model_identity = model_identity
        num_pages = runner.allocate(self._profile_steps)
        # The prefix cache's host tier (KV offloading): evicted pages' K/V, copied back on a later hit.
        host = HostPageStore(config.offload_bytes, runner.page_bytes()) if config.offload_bytes else None
        self.blocks = BlockManager(num_pages, config.page_size, model_identity, config.enable_prefix_caching,
                                   spread=runner.spread_pages, host=host)
        k_max = 0 if speculative is None else speculative.num_speculative_tokens
        self.scheduler = Scheduler(
            SchedulerConfig(
                config.max_num_seqs, config.max_num_batched_tokens, config.max_prefill_seqs, config.decode_steps,
                lookahead=runner.spec_rounds * (k_max + 1), stream_interval=config.stream_interval,
                whole_images=runner.vision is not None and runner.vision.bidirectional,
                by_priority=config.scheduling_policy == "priority",
            ),
            self.blocks,
            None if runner.adapters is None else AdapterSlots(runner.adapters.config.max_loras),
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
        self.no_weights: EngineAsleep | None = None  # why no weights run now (LLM.sleep): requests get it

    def add_request(
        self, request_id: str, prompt: str | Sequence[int], params: SamplingParams | None = None,
        final_only: bool = False, streamed: bool = False, lora_request: LoRARequest | None = None,
        images: Sequence[ImageInput] = (), priority: int = 0,
    ) -> None:
        """Queue a request (text or token ids); invalid ones raise here and never reach a step.

        images: a vision-language model's images, each over its run of placeholder ids in the prompt
        (the facade's processor expands them: entrypoints/multimodal); an encoder-decoder model's
        (Whisper's) audio travels here too, as one `AudioInput` (runtime/audio_input).

        lora_request: the LoRA adapter it runs with (read and checked here, on its first use).

        final_only (vLLM's FINAL_ONLY output kind, what `LLM.generate` asks for): no deltas, only
        the whole output once the request finishes. streamed: someone reads its deltas as they come
        (a stream), so while it decodes each call runs at most `stream_interval` steps.

        priority (vLLM's): under scheduling_policy "priority", lower values are admitted first and
        preempted last; other than 0 it is refused under "fcfs".
        """
        if self.no_weights is not None:
            raise EngineAsleep(str(self.no_weights), self.no_weights.level)  # a fresh one per request
        if request_id in self.groups:
            raise ValueError(f"request_id {request_id!r} is already in use; give each request a unique id")
        params = self.default_params if params is None else params
        priority = check_priority(priority, self.config.scheduling_policy)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        ids = params.kept_prompt(encode_prompt(prompt, self.tokenizer), self.config.max_seq_len)
        check_prompt(ids, params.max_tokens, self.model_config.vocab_size, self.config.max_seq_len)
        check_logit_bias(params.logit_bias, self.model_config.vocab_size)
        stop_ids = params.stop_ids(self.model_config.eos_token_ids)
        check_stop_ids(stop_ids, params.min_tokens)
        adapter = self._adapter_name(lora_request, params)
        audio, images = split_audio(images)
        check_audio(self.model_config, audio, params)
        whole_prompt = self.runner.vision is not None and self.runner.vision.whole_prompt
        if whole_prompt:
            check_whole_prompt(ids, params, self.config.max_num_batched_tokens)
        images = check_images(images, ids, params, self.runner.vision, self.runner.prompt_embeds,
                              self.scheduler.config.whole_images, self.config.max_num_batched_tokens)
        group = self._samples(request_id, prompt if isinstance(prompt, str) else None, ids, params, stop_ids,
                              streamed=streamed, adapter=adapter, images=images, audio=audio, priority=priority,
                              whole_prompt=whole_prompt)
        if params.prompt_logprobs is not None:
            group[0].prompt_logprobs = self.runner.prompt_logprobs(ids, params.prompt_logprobs, self.token_texts,
                                                                   images)
        self.groups[request_id] = group
        if final_only:
            self.final_only.add(request_id)
        for request in group:
            self.scheduler.add(request)

    def _samples(self, request_id: str, text: str | None, ids: list[int], params: SamplingParams,
                 stop_ids: tuple[int, ...], **shared: Any) -> list[Request]:
        """The request's params.n samples, each with its own seed, detokenizer and constraint state; `shared`
        are the fields every sample has alike (Request's)."""
        group: list[Request] = []
        for i in range(params.n):
            seed = (params.seed + i) % 2**63 if params.seed is not None else self.seeds()
            request = Request(
                request_id, i, text, ids, params, seed, stop_ids, leader=group[0] if group else None,
                detokenizer=None if self.tokenizer is None else Detokenizer(self.tokenizer, params.skip_special_tokens),
                grammar=self.structured.start(params),  # compiled (cached) here: bad constraints raise before queueing
                **shared,
            )
            if self.speculator is not None:
                request.spec_counts = zero_counts(self.speculator.k_max)
            group.append(request)
        return group

    def _adapter_name(self, lora_request: LoRARequest | None, params: SamplingParams) -> str | None:
        """The adapter's key (config.lora.adapter_key), once the runner has read and checked it; None for
        the base model."""
        if lora_request is None:
            return None
        if not isinstance(lora_request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest, got {type(lora_request).__name__}")
        if params.prompt_logprobs is not None:
            raise ValueError("prompt_logprobs is not served with a lora_request yet (they are scored by the base "
                             "model before the adapter has a slot); leave prompt_logprobs unset")
        return self._adapters(lora_request.lora_name).register(lora_request)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Read and check an adapter now (vLLM's add_lora): requests naming it later start without
        reading it; a bad one raises here (CheckpointError naming the file and what is wrong)."""
        self._adapters(lora_request.lora_name).register(lora_request)
        return True

    def remove_lora(self, lora: str | int) -> bool:
        """Stop serving an adapter, by lora_name or lora_int_id (vLLM's remove_lora); False when none
        is served so. Requests running with it finish with it; a request naming it later reads it
        again (its directory may have changed), and cached prefixes of the old one are never reused."""
        removed = self._adapters().remove(lora) is not None
        self._drop_removed_adapters()
        return removed

    def list_loras(self) -> set[int]:
        """The lora_int_ids of the adapters served (vLLM's list_loras)."""
        return {request.lora_int_id for request in self._adapters().served()}

    def _adapters(self, name: str | None = None) -> AdapterStore:
        if self.runner.adapters is None:
            asked = "LoRA adapters need" if name is None else f"lora_request {name!r} needs"
            raise ValueError(f"{asked} an engine made with enable_lora=True (LLM(..., enable_lora=True) or "
                             "`jaxinfer serve --enable-lora`)")
        return self.runner.adapters

    def _drop_removed_adapters(self) -> None:
        """Forget removed adapters no request runs with any more (their factors, their idle slot)."""
        store = self.runner.adapters
        if store is None or not store.retired:
            return
        used = {r.adapter for group in self.groups.values() for r in group if not r.finished}
        for key in store.retired - used:
            store.drop(key)
            self.scheduler.adapters.forget(key)

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
        a multi-step decode (or a verify call whose drafts the device makes) whose rows go on
        decoding, the next call starts before it lands, on the tokens and lengths the device
        carries (`Scheduler.chain`): the device never waits for the host between such calls.

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
        self._drop_removed_adapters()
        return outputs

    def metrics(self) -> dict:
        """vLLM-named counters, gauges and latency histograms (see engine.metrics)."""
        scheduler = self.scheduler
        prefix = (scheduler.prefix_queries, scheduler.prefix_hits)
        values = snapshot(
            self.stats, len(scheduler.running), len(scheduler.waiting), self.blocks.usage, prefix,
            scheduler.num_preemptions,
        )
        if scheduler.adapters is not None:
            values.update(adapter_metrics(scheduler))
        if self.blocks.host is not None:
            values.update(self.blocks.host.metrics())
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
        skips_reads = self.speculator is not None and self.speculator.config.catches_up
        return warmup_steps(self.config, self._verify_chunk, skips_reads)

    def program_count(self) -> int:
        """How many programs `warmup` compiles (steps, sampling-slot reset, prompt-logprobs passes)."""
        return len(self.runner.programs(self.step_hosts()))

    def reset_prefix_cache(self) -> None:
        """Drop all cached prefixes (e.g. before a benchmark or after changing weights)."""
        self.land_in_flight()  # a call in flight registers the pages it filled
        self.blocks.reset_prefix_cache()

    def start_profile(self, trace_dir: str | Path | None = None) -> Path:
        """Start the runner's device trace (runtime/profiling) into trace_dir or $JAXINFER_PROFILER_DIR."""
        return self.runner.profiler.start(trace_dir)

    def stop_profile(self) -> Path:
        """Land the call in flight (so the trace holds it), then stop the trace and write it."""
        self.land_in_flight()
        return self.runner.profiler.stop()

    def land_in_flight(self) -> None:
        """Wait for the call in flight, if any, and apply it (its outputs go out with the next step):
        the pools and the block manager are then the engine's alone until the next step."""
        self.pending |= self._land(StepClock())

    def release(self) -> None:
        """Free the page pool (and forget cached prefixes); it is re-made on the next step."""
        self._check_idle("release()")
        self.blocks.reset_prefix_cache()  # the host tier's pages too: close() frees every cache
        self.runner.release()
        self._reset_blocks()

    def replace_weights(self, weights: Any, draft_weights: Any = None) -> None:
        """Run `weights` (the runner's kind; `draft_weights`: the draft's, where given) from the next step
        on. Cached prefixes go: their K/V came from the old weights."""
        self._check_idle("replacing the weights")
        self.runner.replace_weights(weights, draft_weights)
        self.blocks.reset_prefix_cache()
        self.no_weights = None

    def _check_idle(self, what: str) -> None:
        """Land the call in flight (e.g. the last of aborted requests); RuntimeError if requests remain."""
        self.land_in_flight()
        if self.scheduler.running or self.scheduler.waiting:
            count = len(self.scheduler.running) + len(self.scheduler.waiting)
            raise RuntimeError(f"{what} with {count} request(s) in flight; let them finish or abort them first")

    def _catch_up_texts(self, touched: set[str]) -> None:
        """Detokenize what the touched requests' last call appended; a failure fails that request alone."""
        for request_id in touched:
            for request in self.groups[request_id]:
                try:
                    catch_up_text(request)
                except Exception as error:  # e.g. a tokenizer failure
                    log.exception("request %s failed", request.request_id)
                    self._fail_request(request, error)

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

