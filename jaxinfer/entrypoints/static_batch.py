"""Static batches for speculative decoding: prefill a batch together, then run the speculative loop.

(With no speculative decoder it is the pre-engine static path: benchmarks compare against it.)

The serving engine runs every plain request and speculates in its own decode call (n-gram
and draft-model proposers) for `stream` and the server. `LLM.generate` with a draft-model
config still runs here when every request's sampling settings are ones this loop supports
(otherwise the engine takes the whole call), one padded batch at a time with contiguous
target and draft caches. One cache is kept (for the largest batch bucket used), and
`release` frees it.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.cache.contiguous import KVCache
from jaxinfer.cache.donation import is_consumed
from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.config.buckets import bucket
from jaxinfer.config.model import ModelConfig
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.outputs import CompletionOutput, RequestOutput
from jaxinfer.models import Weights
from jaxinfer.models.contiguous_decode import DecodeState
from jaxinfer.parallel.distributed import shared_seed
from jaxinfer.parallel.sharding import to_host
from jaxinfer.runtime import step_programs
from jaxinfer.runtime.cache_spec import CacheSpec
from jaxinfer.sampling.sampler import sampling_arrays
from jaxinfer.speculative import programs as spec_programs
from jaxinfer.speculative.decoder import SpeculativeDecoder

MIN_PROMPT_BUCKET = 16


class StaticBatchGenerator:
    """Speculative generation over padded static batches of up to max_batch_size prompts."""

    def __init__(
        self, weights: Weights, cfg: ModelConfig, dtype: jnp.dtype, max_seq_len: int, max_batch_size: int,
        cache_spec: CacheSpec, speculative: SpeculativeDecoder | None, decode_text,
    ):
        self.weights, self.cfg, self.dtype = weights, cfg, dtype
        self.max_seq_len, self.max_batch_size = max_seq_len, max_batch_size
        self.cache_spec, self.speculative, self.decode_text = cache_spec, speculative, decode_text
        self._cache: KVCache | PagedKVCache | None = None

    def generate(
        self, prompts: list, ids: list[list[int]], params: list[SamplingParams],
        on_finished: Callable[[int], object] | None = None,
    ) -> list[RequestOutput]:
        """One output per prompt, in order; on_finished(count) hears each batch's end (a progress bar)."""
        outputs: list[RequestOutput] = []
        for start in range(0, len(ids), self.max_batch_size):
            chunk = slice(start, start + self.max_batch_size)
            batch = self._run_batch(prompts[chunk], ids[chunk], params[chunk], start)
            outputs += batch
            if on_finished is not None:
                on_finished(len(batch))
        return outputs

    def release(self) -> None:
        """Drop the kept cache."""
        self._cache = None

    def _run_batch(self, prompts: list, ids: list[list[int]], params: list[SamplingParams], offset: int) -> list[RequestOutput]:
        state, features = self._prefill_features(ids, params)
        result = None
        if self.speculative is not None:
            result = self.speculative.decode(self.weights, self.cfg, state, [len(s) for s in ids], features)
        if result is None:
            if is_consumed(state):  # a failed run used up its donated input
                state = self._prefill(ids, params)
            state, stats = step_programs.decode_loop(self.weights, state, jnp.int32(self.max_seq_len), cfg=self.cfg), None
        else:
            state, stats = result
        self._cache = state.cache
        tokens, lengths = to_host((state.tokens, state.lengths))
        outputs = []
        for i, (prompt, seq, p) in enumerate(zip(prompts, ids, params)):
            generated = tokens[i, len(seq) : lengths[i]].tolist()
            stopped = bool(generated) and generated[-1] in p.stop_ids(self.cfg.eos_token_ids)
            completion = CompletionOutput(
                0, self.decode_text(generated), generated, "stop" if stopped else "length",
                spec_stats=stats[i] if stats else None,
            )
            outputs.append(
                RequestOutput(str(offset + i), prompt if isinstance(prompt, str) else None, seq, [completion], True)
            )
        return outputs

    def _prefill(self, ids: list[list[int]], params: list[SamplingParams]) -> DecodeState:
        return self._prefill_features(ids, params)[0]

    def _prefill_features(
        self, ids: list[list[int]], params: list[SamplingParams]
    ) -> tuple[DecodeState, jax.Array | None]:
        """The prefilled state, and the prompts' target features when the proposer reads them (EAGLE)."""
        batch = min(bucket(len(ids)), max(self.max_batch_size, len(ids)))
        prompt_bucket = min(bucket(max(map(len, ids)), MIN_PROMPT_BUCKET), self.max_seq_len)
        state = self._initial_state(ids, params, batch)
        layers = None if self.speculative is None or not self.speculative.enabled else self.speculative.feature_layers
        if layers is None:
            return step_programs.prefill(self.weights, state, cfg=self.cfg, prompt_bucket=prompt_bucket), None
        return spec_programs.prefill_features(
            self.weights, state, cfg=self.cfg, prompt_bucket=prompt_bucket, feature_layers=layers
        )

    def _initial_state(self, ids: list[list[int]], params: list[SamplingParams], batch: int) -> DecodeState:
        """Host-built state: prompts in the token buffer; padding rows start done."""
        n, S = len(ids), self.max_seq_len
        tokens = np.zeros((batch, S), np.int32)
        lengths = np.ones(batch, np.int32)
        max_lengths = np.ones(batch, np.int32)
        stops = [p.stop_ids(self.cfg.eos_token_ids) for p in params]
        stop_array = np.full((batch, bucket(max(4, *map(len, stops)))), -1, np.int32)
        for i, (seq, p, stop) in enumerate(zip(ids, params, stops)):
            tokens[i, : len(seq)] = seq
            lengths[i] = len(seq)
            max_lengths[i] = len(seq) + p.max_tokens
            stop_array[i, : len(stop)] = stop
        padded = list(params) + [SamplingParams(temperature=0)] * (batch - n)
        seeds = [p.seed if p.seed is not None else shared_seed() for p in padded]
        host = self.cache_spec.mesh_layout.put_tree(dict(
            tokens=tokens, lengths=lengths, max_lengths=max_lengths, done=np.arange(batch) >= n,
            stop_ids=stop_array, sampling=sampling_arrays(padded, seeds),
        ))
        return DecodeState(**host, cache=self._take_cache(batch))

    def _take_cache(self, batch: int) -> KVCache | PagedKVCache:
        """The kept cache when it is for this batch size, else a new one (the old one is dropped)."""
        cache, self._cache = self._cache, None
        if cache is None or is_consumed(cache) or _cache_batch(cache) != batch:
            cache = self.cache_spec.make(self.cfg, batch, self.max_seq_len, self.dtype)
        return cache


def _cache_batch(cache: KVCache | PagedKVCache) -> int:
    return cache.page_table.shape[0] if isinstance(cache, PagedKVCache) else cache.k[0].shape[0]

