"""`ModelRunner`: the serving engine's device side, the one place that holds its jax state.

It owns the weights, the page pools (the target's and a draft model's or EAGLE head's), the row
slots' state (page tables, penalty counts, logit bias: runtime/row_state), the compiled programs,
their dispatch and output readback, warm-up, activation profiling and prompt logprobs. The
engine (host only) plans each step as a `HostStep` and hands it to `run`; what it needs to know
about the platform it reads here.

Programs (see config/buckets): a ragged step per (tokens, rows) bucket pair, a multi-step
decode per row bucket (its step count is data: one step runs it too), a verify step per row
bucket when speculating, one sampling-slot reset, and one all-positions pass per prompt-length
bucket (prompt logprobs), a vision-language model's tower (runtime/vision_runner), and with KV
offloading a page gather and scatter per page-count bucket (runtime/kv_offload). `warm_up`
compiles all of them; after it no request mix compiles.
Embeddings' pooled passes (runtime/embeddings) compile on first use, or by `warm_up_embeddings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.config.buckets import bucket
from jaxinfer.config.engine import EngineConfig
from jaxinfer.config.lora import LoRAConfig
from jaxinfer.config.model import ConfigError, ModelConfig
from jaxinfer.models import Weights
from jaxinfer.models.adapter_slots import slot_targets, with_adapter_slots
from jaxinfer.models.lora_weight import adapter_factors, with_factors, write_slot
from jaxinfer.models.vision_language import VisionLanguageConfig, VisionLanguageWeights, whole_prompt
from jaxinfer.models.whisper_encoder import AudioEncoder
from jaxinfer.parallel.distributed import shared_seed
from jaxinfer.parallel.sharding import to_host
from jaxinfer.runtime import step_programs
from jaxinfer.runtime.adapter_store import AdapterStore
from jaxinfer.runtime.assistant_rider import AssistantDraft
from jaxinfer.runtime.audio_runner import AudioRunner
from jaxinfer.runtime.cache_spec import CacheSpec
from jaxinfer.runtime.device_inputs import device_inputs
from jaxinfer.runtime.eagle_rider import EagleDraft
from jaxinfer.runtime.embed_rows import StepRows
from jaxinfer.runtime.embeddings import embedding_programs, pooled_embeddings
from jaxinfer.runtime.engine_step import Rider, StepOutputs
from jaxinfer.runtime.executables import Executables, Program
from jaxinfer.runtime.host_step import HostStep
from jaxinfer.runtime.image_input import ImageInput
from jaxinfer.runtime.kv_offload import PageMover
from jaxinfer.runtime.memory_maps import compile_count, device_bytes_in_use, release_programs_near_cap
from jaxinfer.runtime.ngram_rider import NgramDraft
from jaxinfer.runtime.packed_tree import unpack_host
from jaxinfer.runtime.page_copies import PageCopies
from jaxinfer.runtime.page_table_diffs import PageTables, diff_capacity
from jaxinfer.runtime.pools import DraftConfig, new_pools, pool_size
from jaxinfer.runtime.profiling import Profiler
from jaxinfer.runtime.program_store import default_store
from jaxinfer.runtime.prompt_logprobs import logits_program, prompt_buckets, prompt_logprobs
from jaxinfer.runtime.row_slots import RowSlots, bias_row, holds_sampling_state, slot_ids
from jaxinfer.runtime.row_state import RowState
from jaxinfer.runtime.vision_runner import VisionRunner
from jaxinfer.runtime.warmup import Progress, activation_peak, warm_up
from jaxinfer.runtime.weight_swap import check_twins
from jaxinfer.sampling.logprob import Logprob, TokenText
from jaxinfer.sampling.penalties import PenaltyCounts
from jaxinfer.sampling.slot_state import SlotState
from jaxinfer.sampling.token_bitmask import all_allowed
from jaxinfer.speculative.config import SpeculativeConfig

Pools = tuple[PagedKVCache, Rider]
# batch_invariant programs compile unfused: XLA fuses each program's elementwise work by its
# shapes, and LLVM then contracts a multiply and an add into one FMA or not by that fusion (the
# rotary products were the first seen to differ between a 1-row and a 2-row decode program).
INVARIANT_COMPILE = {"xla_disable_hlo_passes": "fusion"}
FIXED_ARGS = 3  # a step program's weights, pools and row state: their types never change in a runner


class ModelRunner(PageCopies):
    """Weights, pools and programs of one engine; `run` executes a host step."""

    def __init__(
        self, weights: Weights, model_config: ModelConfig, config: EngineConfig, dtype: Any,
        cache_spec: CacheSpec | None = None, speculative: SpeculativeConfig | None = None,
        draft_cfg: DraftConfig = None, draft_weights: Any = None, lora: LoRAConfig | None = None,
        vision: tuple[VisionLanguageConfig, VisionLanguageWeights] | None = None, prompt_embeds: bool = False,
        audio: tuple[AudioEncoder, tuple[int, int]] | None = None,
    ):
        """lora: serve LoRA adapters, `lora.max_loras` of them in one step (slots beside the weights).
        vision: a vision-language model's tower and projector (its ragged steps take image rows).
        prompt_embeds: requests may give their prompt's embedding rows (its ragged steps take them, as images).
        audio: an encoder-decoder model's encoder and its features' shape (runtime/audio_runner)."""
        self.weights, self.model_config, self.config, self.dtype = weights, model_config, config, dtype
        # Made here, not as a default argument: CacheSpec() asks jax for the platform, which must
        # not happen at import (jax.distributed.initialize has to come first).
        self.cache_spec = CacheSpec() if cache_spec is None else cache_spec
        self.speculative, self.draft_cfg, self.draft_weights = speculative, draft_cfg, draft_weights
        if speculative is not None and model_config.mrope_section:  # verify steps repack tokens; offsets do not follow
            raise ConfigError(f"speculative decoding (method {speculative.method!r}) is not supported for M-RoPE "
                              "models (Qwen2-VL, Qwen2.5-VL) yet; leave speculative unset")
        if speculative is not None and vision is not None and whole_prompt(vision[0]):
            raise ConfigError(f"speculative decoding (method {speculative.method!r}) is not supported for PaliGemma "
                              "yet (its prompt is one bidirectional prefix, which drafts and verify steps do not "
                              "run); leave speculative unset")
        if config.offload_bytes and jax.process_count() > 1:  # the host store holds whole pages in one process
            raise ConfigError(f"kv_offloading_size is served by single-process engines; this one spans "
                              f"{jax.process_count()} processes: leave it unset")
        self.adapters: AdapterStore | None = None
        self._write_slot: Callable | None = None
        if lora is not None:
            layout = self.cache_spec.mesh_layout
            replicated = lambda shape, dtype: layout.zeros(shape, dtype, (None,) * len(shape))  # noqa: E731
            self.weights = with_adapter_slots(weights, lora.max_loras, lora.max_lora_rank, replicated)
            self.adapters = AdapterStore(lora, model_config, slot_targets(weights), dtype)
        self.platform = jax.default_backend()
        # A GPU runs a conditional or a loop of data-dependent trip count by reading its
        # predicate back on the host each time: its programs compute every option (branchless)
        # and loop a fixed number of times (multi-step calls do not stop at a finished row).
        self.branchless = self.platform == "gpu"
        self.stop_early = not self.branchless
        k_max = 0 if speculative is None else speculative.num_speculative_tokens
        # Exactly k+1 wide (not a power of two): on CPU a verify step's projections cost ~linearly
        # in its rows (k=4: 8 -> 5 rows made adaptive n-gram 1.37x -> 1.52x plain at batch 1).
        self.verify_chunk = k_max + 1
        # A draft model or head drafts on the device, so one call may run several verify rounds, as
        # a plain call runs several decode steps (prompt lookup drafts on the host: one round).
        on_device = speculative is not None and not speculative.drafts_on_host
        self.spec_rounds = max(1, config.decode_steps // 2) if on_device else 1
        self.width = bucket(config.pages_per_seq)  # every page table's width: lengths mask the rest
        self.spread_pages = self.platform == "cpu"  # see BlockManager(spread=...)
        self.num_pages = 0
        self.input_bytes = 0  # the last dispatched step's inputs sent host -> device
        self.profiler = Profiler()  # LLM.start_profile / stop_profile, the server's profile routes
        self.pages: PagedKVCache | None = None
        self.draft: Rider = None
        self.slots = RowSlots(config.max_num_seqs + 1)
        self.tables = PageTables(config.max_num_seqs + 1, self.width)
        self.state: RowState | None = None
        self.table_bytes = 0  # the last step's whole page tables sent (more entries changed than it ships)
        self.warmup_seconds: dict[str, float] = {}  # the last warm-up's tracing and compiling (warmup.warm_up)
        options = INVARIANT_COMPILE if self.cache_spec.batch_invariant else None
        self.executables = Executables(default_store(), step_programs.static_argnames, options)
        self.free_masks: dict[int, jax.Array] = {}  # sampled positions -> an all-ones bitmask on the device
        self.mover = PageMover(self.executables, config.pages_per_seq)  # sessions' and offloading's page copies
        self.vision = None if vision is None else VisionRunner(*vision, self.cache_spec.mesh_layout, self.executables)
        self.prompt_embeds = prompt_embeds
        self.audio = None if audio is None else AudioRunner(*audio, self.cache_spec.mesh_layout, self.executables)
        # What makes each ragged step's embedding override; None: its steps take none (a text-only model's)
        self.step_rows = self.vision.rows if self.vision is not None else (
            StepRows(model_config.embedding_size, self.cache_spec.mesh_layout) if prompt_embeds else None)

    def allocate(self, profile_hosts: Callable[[], list[HostStep]]) -> int:
        """Make the row slots' state, size and make the page pools; how many pages they hold.

        profile_hosts: the steps whose programs hold the most activations, compiled (not run)
        only where the pool is sized from device memory (an accelerator with num_pages unset).
        """
        self.state = self._new_state()
        self.num_pages = pool_size(
            self.config, self.model_config, self.draft_cfg, self.dtype, self.cache_spec,
            lambda: self.activation_peak(profile_hosts()),
        )
        self.reset_pools()
        return self.num_pages

    def reset_pools(self) -> None:
        """Fresh (zeroed) pools of num_pages pages and row state, e.g. after a failed step consumed them."""
        self.pages, self.draft = self._new_pools(self.num_pages)
        self.state = self._new_state()
        self.slots.clear()
        self.tables.clear()

    def release(self) -> None:
        """Free the pools (and the all-ones masks); the next step makes them again."""
        self.pages = self.draft = self.state = None
        self.free_masks = {}
        self.slots.clear()
        self.tables.clear()

    def replace_weights(self, weights: Weights, draft_weights: Any = None) -> None:
        """Run `weights` (and the draft's `draft_weights`, where given) from the next step on.

        They must be the served trees' twins (types, shapes, dtypes, shardings: `weight_swap` makes
        them so), which the compiled programs then take as they are; LoRA slots keep their adapters.
        """
        if self.adapters is not None:
            lora, layout = self.adapters.config, self.cache_spec.mesh_layout
            replicated = lambda shape, dtype: layout.zeros(shape, dtype, (None,) * len(shape))  # noqa: E731
            slotted = with_adapter_slots(weights, lora.max_loras, lora.max_lora_rank, replicated)
            weights = with_factors(slotted, adapter_factors(self.weights))
        check_twins(weights, self.weights, "weights")
        if draft_weights is not None:
            check_twins(draft_weights, self.draft_weights, "draft weights")
            self.draft_weights = draft_weights
        self.weights = weights

    def compiled_programs(self) -> int:
        """Programs compiled or loaded from the persistent cache in this process (see memory_maps)."""
        return compile_count()

    def device_bytes_in_use(self) -> int | None:
        """Bytes JAX's allocators hold on this process's devices, or None where they report nothing (CPU)."""
        return device_bytes_in_use()

    def shared_seed(self) -> int:
        """A random seed for a request without one, the same on every process."""
        return shared_seed()

    def program_for(self, host: HostStep, state: tuple | None = None) -> Program:
        """The compiled program a host step runs, and its arguments.

        state: (pools, row state) it runs on (default: the runner's, made first if released).
        """
        capacity = diff_capacity(len(host.tokens), len(host.lengths), self.config.page_size)
        if state is None:
            self._pools_made()
            slots, entries = self._rows_for(host, capacity)
            if self.audio is not None:  # rows starting their request: its encoder first (cache/cross_pool)
                self.pages = self.audio.fill(self.pages, host, slots)
            state = (self.pages, self.draft), self.state
        else:
            slots, entries = np.zeros(len(host.lengths), np.int32), self.tables.no_changes(capacity)
        (pages, draft_pool), row_state = state
        layout = self.cache_spec.mesh_layout
        inputs = device_inputs(host, slots, entries, self.width, layout, self.branchless,
                               bool(self.model_config.mrope_section))
        head = [self.weights, pages, row_state, inputs, self._bitmask(host)]
        draft = dict(draft=draft_pool, draft_weights=self.draft_weights)
        cfg = self.model_config
        if host.drafts is not None:
            kwargs = dict(cfg=cfg, max_rounds=self.spec_rounds, rule=self.speculative.acceptance_rule)
            return Program(step_programs.verify_rounds, head, {**kwargs, **draft}, FIXED_ARGS)
        if host.decode:
            # An EAGLE head or Gemma 4 assistant rides decode calls (it stores their features), as the
            # device's lookup does (it stores their tokens); a draft model is caught up by the next verify, so its
            # pool and weights stay out.
            rides = isinstance(draft_pool, (EagleDraft, AssistantDraft, NgramDraft))
            kwargs = dict(cfg=cfg, max_steps=self.config.decode_steps, stop_early=self.stop_early)
            return Program(step_programs.multi_decode, head, {**kwargs, **(draft if rides else {})}, FIXED_ARGS)
        # the lookup always stores its tokens, an assistant its states
        skips = draft_pool is not None and not isinstance(draft_pool, (NgramDraft, AssistantDraft))
        reads = dict(draft_reads=host.draft_reads) if skips else {}
        images = {} if self.step_rows is None else dict(images=self.step_rows.override(host))
        return Program(step_programs.ragged_step, head, dict(cfg=cfg, **draft, **reads, **images), FIXED_ARGS)

    def load_adapter(self, slot: int, name: str) -> None:
        """Write a registered adapter's factors into device slot `slot`."""
        layout = self.cache_spec.mesh_layout
        values = [layout.put(v) for v in self.adapters.slot_values(name)]
        factors = self._slot_writer()(adapter_factors(self.weights), layout.put(np.int32(slot)), values)
        self.weights = with_factors(self.weights, factors)

    def _slot_writer(self) -> Callable:
        """The one program that writes an adapter slot (any slot, any adapter), compiled on first use."""
        if self._write_slot is None:
            layout = self.cache_spec.mesh_layout
            values = [jax.ShapeDtypeStruct(shape, self.dtype, sharding=layout.sharding(shape, (None, None)))
                      for shape in self.adapters.slot_shapes()]
            slot = jax.ShapeDtypeStruct((), np.int32, sharding=layout.sharding((), ()))
            self._write_slot = write_slot.lower(adapter_factors(self.weights), slot, values).compile()
        return self._write_slot

    def _bitmask(self, host: HostStep) -> jax.Array:
        """The step's structured-output masks on the device: shipped when a row is constrained, else an
        all-ones array of the same shape made once (free steps send no O(vocab) bytes)."""
        layout = self.cache_spec.mesh_layout
        if host.bitmask is not None:
            return layout.put_tree(host.bitmask)
        positions = len(host.tokens) if host.drafts is not None else len(host.requests)
        if positions not in self.free_masks:
            self.free_masks[positions] = layout.put(all_allowed(positions, self.model_config.vocab_size))
        return self.free_masks[positions]

    def _rows_for(self, host: HostStep, capacity: int) -> tuple[np.ndarray, np.ndarray]:
        """(each row's slot [R], the page entries its slot gained [capacity, 3]); writes the sampling
        state of requests that just took a slot, and sends every slot's table whole when more changed."""
        slots, fresh = self.slots.assign(host.requests)
        for slot, request in fresh:
            if holds_sampling_state(request.params):
                width = self.config.max_seq_len
                sampling = self.executables(Program(step_programs.reset_sampling_slot, [
                    self.state.sampling, np.int32(slot), slot_ids(request.known_prompt_ids, width),
                    slot_ids(request.output_ids, width), *bias_row(request.params.logit_bias),
                ], {}, fixed=1))
                self.state = dataclasses.replace(self.state, sampling=sampling)
        entries = self.tables.changes(slots, [r.pages if r is not None else None for r in host.requests], capacity)
        self.table_bytes = 0
        if entries is None:
            self.state = dataclasses.replace(self.state, page_tables=self.cache_spec.mesh_layout.put(self.tables.table))
            self.table_bytes, entries = self.tables.table.nbytes, self.tables.no_changes(capacity)
        return slots, entries

    def dispatch(self, host: HostStep, lap: Callable[[str], None] = lambda phase: None) -> Any:
        """Start the step's program; its outputs come back packed (`read` them). lap(phase) marks
        the end of making its inputs ("inputs") and of the call ("dispatch")."""
        release_programs_near_cap()  # XLA:CPU maps each compiled program into this process (see memory_maps)
        program = self.program_for(host)
        # what went host -> device: everything after the weights, pools and slot state, but a free bitmask
        shipped = [a for a in program.args[FIXED_ARGS:] if not any(a is mask for mask in self.free_masks.values())]
        self.input_bytes = sum(int(leaf.nbytes) for leaf in jax.tree.leaves(shipped)) + self.table_bytes
        lap("inputs")
        try:
            out, self.pages, self.state, draft = self.executables(program)
        except Exception as error:
            self.executables.distrust_store_after(error)
            raise
        lap("dispatch")
        if "draft" in program.kwargs:  # the draft's pool went in, so its successor came out
            self.draft = draft
        return out

    def read(self, packed: Any) -> StepOutputs:
        """A dispatched step's outputs as NumPy (waits for the device). A program that fails for
        lack of its own code (a damaged stored copy) has every stored program of the runner
        compiled again from the next call on."""
        try:
            out = unpack_host(to_host(packed))
        except Exception as error:
            self.executables.distrust_store_after(error)
            raise
        self.mover.settle()  # pages offloaded before this call: their copies have landed by now
        return out

    def programs(self, hosts: list[HostStep]) -> list[Callable[[], Program]]:
        """Every program the engine may run, as thunks: the step programs of `hosts` (one padding step
        of each shape), the sampling-slot reset and the prompt-logprobs passes."""
        width = self.config.max_seq_len
        reset = Program(step_programs.reset_sampling_slot,
                        [self.state.sampling, np.int32(0), slot_ids([], width), slot_ids([], width), *bias_row(None)],
                        {}, fixed=1)
        spec, vision = self.cache_spec, self.vision
        passes = [
            lambda size=size: logits_program(self.weights, self.model_config, size, self.dtype, spec.cpu_kernels,
                                             spec.mesh_layout, None if vision is None else vision.prompt_rows(0))
            for size in prompt_buckets(self.config.max_seq_len)
        ] if not self.model_config.encoder_frames else []  # cross-attention runs in the engine's steps only
        tower = [] if self.vision is None else [self.vision.program]
        if self.audio is not None:
            tower = [lambda: self.audio.program(self._pools_made().pages)]
        moves = self.mover.programs(lambda: self._pools_made().pages) if self.config.offload_bytes else []
        return [lambda host=host: self.program_for(host) for host in hosts] + [lambda: reset] + passes + tower + moves

    def warm_up(
        self, hosts: list[HostStep], progress: bool = False, threads: int | None = None,
        on_program: Progress | None = None,
    ) -> int:
        """Compile every program (see `programs`); how many were compiled. Its time, split into tracing
        and compiling (see warmup.warm_up), is kept in `warmup_seconds`."""
        if self.pages is None:
            self.reset_pools()
        self.warmup_seconds = {}
        if self.adapters is not None:
            self._slot_writer()
        return warm_up(self.programs(hosts), self.executables, progress, threads, on_program, self.warmup_seconds)

    def activation_peak(self, hosts: list[HostStep]) -> int:
        """Device bytes the programs of `hosts` need beside the weights and pools (see warmup.activation_peak)."""
        state = self._new_pools(self.config.pages_per_seq + 1), self.state
        return activation_peak([self.program_for(host, state) for host in hosts], self.executables)

    def prompt_logprobs(self, ids: list[int], k: int, text: TokenText, images: tuple[ImageInput, ...] = ()
                        ) -> list[dict[int, Logprob] | None]:
        """Per prompt token its logprob and the top k given the prefix (vLLM's prompt_logprobs); images: the
        prompt's (a vision-language model's pass always takes image rows: all text without them)."""
        return prompt_logprobs(
            self.weights, self.model_config, ids, k, self.dtype, self.config.max_seq_len,
            self.cache_spec.cpu_kernels, self.cache_spec.mesh_layout, text, self.executables,
            None if self.vision is None else self.vision.prompt_rows(len(ids), images),
        )

    def embed(self, prompts: list[list[int]], pooling: str, on_pass: Callable[[int], object] | None = None,
              head: jax.Array | None = None) -> np.ndarray:
        """Float32 [len(prompts), D]: each prompt's pooled final hidden states, padded batches of at most
        max_num_batched_tokens tokens (see runtime/embeddings); with a classifier's head, its logits."""
        release_programs_near_cap()
        return pooled_embeddings(
            self.weights, self.model_config, prompts, self.dtype, self.config.max_seq_len,
            self.config.max_num_batched_tokens, pooling, self.cache_spec.cpu_kernels, self.cache_spec.mesh_layout,
            self.executables, on_pass, head,
        )

    def warm_up_embeddings(self, pooling: str, on_program: Progress | None = None,
                           head: jax.Array | None = None) -> int:
        """Compile every pass `embed` may run with `pooling` (and `head`: a pooling server's warm-up); how many."""
        programs = embedding_programs(
            self.weights, self.model_config, self.dtype, self.config.max_seq_len, self.config.max_num_batched_tokens,
            pooling, self.cache_spec.cpu_kernels, self.cache_spec.mesh_layout, head,
        )
        return warm_up(programs, self.executables, False, None, on_program, self.warmup_seconds)

    def _pools_made(self) -> "ModelRunner":
        """This runner, its pools made first if they were released."""
        if self.pages is None:
            self.reset_pools()
        return self

    def _new_pools(self, num_pages: int) -> Pools:
        return new_pools(self.model_config, self.draft_cfg, num_pages, self.config.page_size, self.dtype,
                         self.cache_spec, self.config.max_num_seqs + 1)

    def _new_state(self) -> RowState:
        """Empty row slots (page 0 tables, zero counts, no bias, no decode carry), one per engine row and
        slot 0, replicated over the mesh."""
        slots, layout = self.config.max_num_seqs + 1, self.cache_spec.mesh_layout
        shape = (slots, self.model_config.vocab_size)
        counts = PenaltyCounts(layout.zeros(shape, np.int32, (None, None)), layout.zeros(shape, bool, (None, None)))
        ids, bias = bias_row(None)
        sampling = SlotState(counts, layout.put(np.tile(ids, (slots, 1))), layout.put(np.tile(bias, (slots, 1))))
        carry = [layout.zeros((slots,), dtype, (None,)) for dtype in (np.int32, np.int32, bool)]
        return RowState(layout.zeros((slots, self.width), np.int32, (None, None)), sampling, *carry)

