"""`ModelRunner`: the serving engine's device side, the one place that holds its jax state.

It owns the weights, the page pools (the target's and a draft model's or EAGLE head's), the
compiled step programs, their dispatch and output readback, warm-up, activation profiling and
prompt logprobs. The engine (host only) plans each step as a `HostStep` and hands it to `run`;
what it needs to know about the platform (a CPU's page spreading, whether a multi-step call may
end early) it reads here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.config.buckets import bucket, chunk_step_for, tight_chunk_step
from jaxinfer.config.engine import EngineConfig
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights
from jaxinfer.parallel.distributed import shared_seed
from jaxinfer.parallel.sharding import to_host
from jaxinfer.runtime import step_programs
from jaxinfer.runtime.cache_spec import CacheSpec
from jaxinfer.runtime.device_inputs import device_inputs
from jaxinfer.runtime.eagle_rider import EagleDraft
from jaxinfer.runtime.engine_step import Rider, StepOutputs
from jaxinfer.runtime.host_step import HostStep
from jaxinfer.runtime.memory_maps import release_programs_near_cap
from jaxinfer.runtime.packed_tree import pack_host, unpack_host
from jaxinfer.runtime.pools import DraftConfig, new_pools, pool_size
from jaxinfer.runtime.prompt_logprobs import prompt_logprobs
from jaxinfer.runtime.verify_step import Drafts
from jaxinfer.runtime.warmup import Program, Progress, activation_peak, warm_up
from jaxinfer.sampling.logprob import Logprob, TokenText
from jaxinfer.speculative.config import SpeculativeConfig

MIN_PAGE_TOKENS = 128  # page-table widths start here: fewer programs, negligible extra reads
Pools = tuple[PagedKVCache, Rider]


class ModelRunner:
    """Weights, pools and step programs of one engine; `run` executes a host step."""

    def __init__(
        self, weights: Weights, model_config: ModelConfig, config: EngineConfig, dtype: Any,
        cache_spec: CacheSpec | None = None, speculative: SpeculativeConfig | None = None,
        draft_cfg: DraftConfig = None, draft_weights: Any = None,
    ):
        self.weights, self.model_config, self.config, self.dtype = weights, model_config, config, dtype
        # Made here, not as a default argument: CacheSpec() asks jax for the platform, which must
        # not happen at import (jax.distributed.initialize has to come first).
        self.cache_spec = CacheSpec() if cache_spec is None else cache_spec
        self.speculative, self.draft_cfg, self.draft_weights = speculative, draft_cfg, draft_weights
        self.platform = jax.default_backend()
        # Whether a multi-step call ends at the first finished row (see engine_step.multi_decode):
        # not on a GPU, where each iteration's continue-test is a host round trip.
        self.stop_early = self.platform != "gpu"
        k_max = 0 if speculative is None else speculative.num_speculative_tokens
        # Exactly k+1 wide (not a power of two): on CPU a verify step's projections cost ~linearly
        # in its rows (k=4: 8 -> 5 rows made adaptive n-gram 1.37x -> 1.52x plain at batch 1).
        self.verify_chunk = k_max + 1
        # A draft model or head drafts on the device, so one call may run several verify rounds, as
        # a plain call runs several decode steps (prompt lookup drafts on the host: one round).
        on_device = speculative is not None and speculative.method != "ngram"
        self.spec_rounds = max(1, config.decode_steps // 2) if on_device else 1
        self.max_pages = bucket(config.pages_per_seq)
        self.min_pages = min(self.max_pages, bucket(-(-MIN_PAGE_TOKENS // config.page_size)))
        # Steps with prefill chunks always use the full page-table width. Narrowing them too (the
        # gathered CPU attention pays for width) multiplied their programs by the widths: 585 for
        # the demo at max_num_seqs=32, and loading that many exhausted XLA:CPU's JIT code memory
        # ("LLVM ERROR: Unable to allocate section memory") during `jaxinfer serve` warm-up.
        self.narrow_mixed = False
        self.chunk_step = chunk_step_for(self.platform, config.max_num_batched_tokens)
        self.tight_chunk_step = tight_chunk_step(self.platform)
        self.spread_pages = self.platform == "cpu"  # see BlockManager(spread=...)
        self.num_pages = 0
        self.pages: PagedKVCache | None = None
        self.draft: Rider = None

    def allocate(self, profile_hosts: Callable[[], list[HostStep]]) -> int:
        """Size and make the page pools; how many pages they hold.

        profile_hosts: the steps whose programs hold the most activations, compiled (not run)
        only where the pool is sized from device memory (an accelerator with num_pages unset).
        """
        self.num_pages = pool_size(
            self.config, self.model_config, self.draft_cfg, self.dtype, self.cache_spec,
            lambda: self.activation_peak(profile_hosts()),
        )
        self.reset_pools()
        return self.num_pages

    def reset_pools(self) -> None:
        """Fresh (zeroed) pools of num_pages pages, e.g. after a failed step consumed them."""
        self.pages, self.draft = self._new_pools(self.num_pages)

    def release(self) -> None:
        """Free the pools; the next step makes them again."""
        self.pages = self.draft = None

    def shared_seed(self) -> int:
        """A random seed for a request without one, the same on every process."""
        return shared_seed()

    def program_for(self, host: HostStep, pools: Pools | None = None) -> Program:
        """The compiled program a host step runs, and its arguments.

        pools: the page pools it runs on (default: the runner's, made first if released).
        """
        inputs = device_inputs(host, self.model_config.vocab_size, self.cache_spec.mesh_layout)
        if pools is None:
            if self.pages is None:
                self.reset_pools()
            pools = self.pages, self.draft
        pages, draft_pool = pools
        draft = dict(draft=draft_pool, draft_weights=self.draft_weights)
        if host.drafts is not None:
            layout = self.cache_spec.mesh_layout
            drafts = layout.put_tree(pack_host(Drafts(host.drafts, host.num_drafts)))
            capacity, history, start = layout.put_tree((host.capacity, host.history, host.draft_start))
            args = [self.weights, pages, inputs, drafts, np.int32(host.num_rounds), capacity, history, start]
            kwargs = dict(cfg=self.model_config, max_rounds=self.spec_rounds, rule=self.speculative.rule)
            return step_programs.verify_rounds, args, {**kwargs, **draft}
        if host.num_steps > 1:
            # Only an EAGLE head rides plain multi-step calls (it stores their features); a draft
            # model is caught up by the next verify, so its pool and weights stay out and the call
            # runs the plain program.
            rides = isinstance(draft_pool, EagleDraft)
            kwargs = dict(cfg=self.model_config, max_steps=self.config.decode_steps, stop_early=self.stop_early)
            args = [self.weights, pages, inputs, np.int32(host.num_steps)]
            return step_programs.multi_decode, args, {**kwargs, **(draft if rides else {})}
        return step_programs.ragged_step, [self.weights, pages, inputs], dict(cfg=self.model_config, **draft)

    def dispatch(self, host: HostStep, lap: Callable[[str], None] = lambda phase: None) -> Any:
        """Start the step's program; its outputs come back packed (`read` them). lap(phase) marks
        the end of making its inputs ("inputs") and of the call ("dispatch")."""
        release_programs_near_cap()  # XLA:CPU maps each compiled program into this process (see memory_maps)
        program, args, kwargs = self.program_for(host)
        lap("inputs")
        out, self.pages, draft = program(*args, **kwargs)
        lap("dispatch")
        if "draft" in kwargs:  # the draft's pool went in, so its successor came out
            self.draft = draft
        return out

    def read(self, packed: Any) -> StepOutputs:
        """A dispatched step's outputs as NumPy (waits for the device)."""
        return unpack_host(to_host(packed))

    def run(self, host: HostStep, lap: Callable[[str], None] = lambda phase: None) -> StepOutputs:
        """Run the step and read its outputs."""
        return self.read(self.dispatch(host, lap))

    def warm_up(
        self, hosts: list[HostStep], progress: bool = False, threads: int | None = None,
        on_program: Progress | None = None,
    ) -> int:
        """Compile and run (padding only) each host step's program; how many ran (see warmup.warm_up)."""
        return warm_up(self.program_for, self.dispatch, hosts, progress, threads, on_program)

    def activation_peak(self, hosts: list[HostStep]) -> int:
        """Device bytes the programs of `hosts` need beside the weights and pools (see warmup.activation_peak)."""
        pools = self._new_pools(self.config.pages_per_seq + 1)
        return activation_peak(lambda host: self.program_for(host, pools), hosts)

    def prompt_logprobs(self, ids: list[int], k: int, text: TokenText) -> list[dict[int, Logprob] | None]:
        """Per prompt token its logprob and the top k given the prefix (vLLM's prompt_logprobs)."""
        return prompt_logprobs(
            self.weights, self.model_config, ids, k, self.dtype, self.config.max_seq_len,
            self.cache_spec.cpu_kernels, self.cache_spec.mesh_layout, text,
        )

    def _new_pools(self, num_pages: int) -> Pools:
        return new_pools(self.model_config, self.draft_cfg, num_pages, self.config.page_size, self.dtype,
                         self.cache_spec)
