"""`LLM`: the notebook entry point. Loads a model once, then generates, streams or scores."""

from __future__ import annotations

import dataclasses
import json
import secrets
from pathlib import Path
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer import steps
from jaxinfer import validation
from jaxinfer.checkpoint import load_weights
from jaxinfer.generation import DecodeState
from jaxinfer.cache_spec import CacheSpec, is_consumed
from jaxinfer.kv_cache import KVCache, init_cache
from jaxinfer.models import pack_for_cpu
from jaxinfer.paged_kv_cache import PagedKVCache
from jaxinfer.sampling import sampling_arrays
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.speculative import SpeculativeConfig
from jaxinfer.speculative.decoder import SpeculativeDecoder, build_speculative
from jaxinfer.tokenizer import Detokenizer, load_tokenizer

DEMO_MODEL = Path(__file__).parent / "assets" / "demo" / "target"
DEMO_DRAFT = Path(__file__).parent / "assets" / "demo" / "draft"  # the demo target's speculative draft
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
MIN_PROMPT_BUCKET = 16
STREAM_CHUNK = 8

Prompt = str | Sequence[int]


@dataclasses.dataclass
class RequestOutput:
    """One finished request: generated text and ids, and why it stopped ("stop" or "length")."""

    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str
    spec_stats: dict | None = None  # speculative acceptance for this request (None when plain)


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= n (shape buckets keep compiled programs few)."""
    return 1 << max(0, (n - 1).bit_length())


def resolve_dtype(dtype: str, model_dir: Path) -> jnp.dtype:
    """A jnp dtype from a name; "auto" takes the checkpoint's own dtype (float32 if unstated)."""
    dtype = validation.dtype_name(dtype, "dtype")
    if dtype == "auto":
        cfg = json.loads((model_dir / "config.json").read_text())
        stored = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
        dtype = validation.dtype_name(stored, f"{model_dir / 'config.json'} dtype", allow_auto=False)
    return DTYPES[dtype]


class LLM:
    """A loaded model: `generate` for batches, `stream` for text as it is produced, `logits` for research."""

    def __init__(
        self,
        model: str | Path | None = None,
        dtype: str = "auto",
        max_seq_len: int | None = None,
        max_batch_size: int = 64,
        speculative: SpeculativeConfig | None = None,
        kv_cache: str = "auto",
        kv_cache_dtype: str = "auto",
        page_size: int = 16,
        attention_backend: str = "auto",
        interpret_kernels: bool = False,
    ):
        self.model_dir = validation.model_dir(DEMO_MODEL if model is None else model, "model")
        validation.optional_int(max_seq_len, "max_seq_len", 1)
        validation.positive_int(max_batch_size, "max_batch_size")
        if speculative is not None and not isinstance(speculative, SpeculativeConfig):
            raise TypeError(f"speculative must be a SpeculativeConfig or None, got {type(speculative).__name__}")
        self.dtype = resolve_dtype(dtype, self.model_dir)
        self.config, weights = load_weights(self.model_dir, self.dtype)
        self.weights = pack_for_cpu(weights)
        limit = self.config.max_position_embeddings
        self.max_seq_len = int(max_seq_len or min(limit, 2048))
        if self.max_seq_len > limit:
            raise ValueError(f"max_seq_len {self.max_seq_len} exceeds the model's max_position_embeddings {limit}")
        self.max_batch_size = max_batch_size
        self.cache_spec = CacheSpec(kv_cache, page_size, kv_cache_dtype, attention_backend, interpret_kernels)
        self.tokenizer = load_tokenizer(self.model_dir)
        self._caches: dict[int, KVCache | PagedKVCache] = {}
        self.speculative: SpeculativeDecoder | None = build_speculative(
            speculative, self.config, self.tokenizer, self.dtype, self.max_seq_len
        )

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for one prompt or many (str or token ids); one output per prompt, in order."""
        prompts = self._as_list(prompts)
        params_list = self._params_for(prompts, params)
        outputs: list[RequestOutput] = []
        for start in range(0, len(prompts), self.max_batch_size):
            chunk = slice(start, start + self.max_batch_size)
            state, ids = self._prefill(prompts[chunk], params_list[chunk])
            state, spec_stats = self._decode_chunk(state, prompts[chunk], params_list[chunk], ids)
            finished = self._finish(state, prompts[chunk], ids, params_list[chunk])
            for out, stats in zip(finished, spec_stats or []):
                out.spec_stats = stats
            outputs += finished
        return outputs

    def metrics(self) -> dict:
        """Totals since load: speculative drafted/accepted counts and rates (empty when not speculating)."""
        return self.speculative.metrics() if self.speculative is not None else {}

    def _decode_chunk(
        self, state: DecodeState, prompts: list[Prompt], params: list[SamplingParams], ids: list[list[int]]
    ) -> tuple[DecodeState, list[dict] | None]:
        """Decode a prefilled chunk to the end, speculatively when configured; failures fall back to plain."""
        if self.speculative is not None:
            result = self.speculative.decode(self.weights, self.config, state, [len(s) for s in ids])
            if result is not None:
                return result
            if is_consumed(state):  # a failed run used up its donated input
                state, _ = self._prefill(prompts, params)
        return steps.decode_loop(self.weights, state, jnp.int32(self.max_seq_len), cfg=self.config), None

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text pieces of one request as they are produced (the device runs a few tokens per call)."""
        params = self._params_for([prompt], params)[0]
        state, ids = self._prefill([prompt], [params])
        detok = Detokenizer(self.tokenizer)
        while True:
            generated = self._generated(state, 0, len(ids[0]))
            piece = detok.push(generated)
            if piece:
                yield piece
            if bool(state.done[0]):
                break
            state = steps.decode_loop(self.weights, state, jnp.int32(STREAM_CHUNK), cfg=self.config)
        self._caches[state.tokens.shape[0]] = state.cache
        tail = detok.flush()
        if tail:
            yield tail

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Float32 next-token logits [len(token_ids), vocab] at every position of one sequence."""
        token_ids = validation.token_ids(token_ids, "token_ids", self.config.vocab_size)
        n = len(token_ids)
        self._check_prompt(token_ids, 0)
        bucket = min(next_power_of_two(max(n, MIN_PROMPT_BUCKET)), self.max_seq_len)
        tokens = np.zeros((1, bucket), np.int32)
        tokens[0, :n] = token_ids
        cache = init_cache(self.config, 1, bucket, self.dtype)
        out = steps.all_logits(self.weights, jnp.asarray(tokens), cache, cfg=self.config)
        return np.asarray(out[0, :n])

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt (strings go through the model's tokenizer)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"{self.model_dir} has no tokenizer files; pass token ids instead of text")
            # verbose=False: the length check below says what to change; HF's warning only adds noise.
            return list(self.tokenizer.encode(prompt, verbose=False))
        return validation.token_ids(prompt, "prompt", self.config.vocab_size)

    def _as_list(self, prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
        return validation.prompts(prompts, "prompts", self.config.vocab_size)

    def _params_for(
        self, prompts: list[Prompt], params: SamplingParams | Sequence[SamplingParams] | None
    ) -> list[SamplingParams]:
        if params is None or isinstance(params, SamplingParams):
            params_list = [params or SamplingParams()] * len(prompts)
        elif isinstance(params, (list, tuple)) and all(isinstance(p, SamplingParams) for p in params):
            params_list = list(params)
        else:
            raise TypeError(
                f"params must be a SamplingParams, a list of them (one per prompt) or None, got {type(params).__name__}"
            )
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts; pass one or one each")
        for p in params_list:
            validation.token_ids(p.stop_token_ids, "stop_token_ids", self.config.vocab_size)
        return params_list

    def _check_prompt(self, ids: list[int], max_tokens: int) -> None:
        if not ids:
            raise ValueError("prompt is empty; give at least one token")
        if len(ids) + max_tokens > self.max_seq_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds max_seq_len "
                f"{self.max_seq_len}; shorten the prompt, lower max_tokens or raise LLM(max_seq_len=...)"
            )
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.config.vocab_size})")

    def _stop_ids(self, params: SamplingParams) -> list[int]:
        eos = [] if params.ignore_eos else list(self.config.eos_token_ids)
        return eos + list(params.stop_token_ids)

    def _prefill(self, prompts: list[Prompt], params: list[SamplingParams]) -> tuple[DecodeState, list[list[int]]]:
        ids = [self.encode(p) for p in prompts]
        for seq, p in zip(ids, params):
            self._check_prompt(seq, p.max_tokens)
        batch = min(next_power_of_two(len(ids)), max(self.max_batch_size, len(ids)))
        bucket = min(next_power_of_two(max(MIN_PROMPT_BUCKET, *map(len, ids))), self.max_seq_len)
        state = self._initial_state(ids, params, batch)
        return steps.prefill(self.weights, state, cfg=self.config, prompt_bucket=bucket), ids

    def _initial_state(self, ids: list[list[int]], params: list[SamplingParams], batch: int) -> DecodeState:
        """Host-built state: prompts in the token buffer; padding rows start done."""
        n, S = len(ids), self.max_seq_len
        tokens = np.zeros((batch, S), np.int32)
        lengths = np.ones(batch, np.int32)
        max_lengths = np.ones(batch, np.int32)
        stops = [self._stop_ids(p) for p in params]
        stop_ids = np.full((batch, next_power_of_two(max(4, *map(len, stops)))), -1, np.int32)
        for i, (seq, p, stop) in enumerate(zip(ids, params, stops)):
            tokens[i, : len(seq)] = seq
            lengths[i] = len(seq)
            max_lengths[i] = len(seq) + p.max_tokens
            stop_ids[i, : len(stop)] = stop
        padded = list(params) + [SamplingParams(temperature=0)] * (batch - n)
        seeds = [p.seed if p.seed is not None else secrets.randbits(63) for p in padded]
        return DecodeState(
            tokens=jnp.asarray(tokens),
            lengths=jnp.asarray(lengths),
            max_lengths=jnp.asarray(max_lengths),
            done=jnp.asarray(np.arange(batch) >= n),
            stop_ids=jnp.asarray(stop_ids),
            sampling=sampling_arrays(padded, seeds),
            cache=self._cache(batch),
        )

    def _cache(self, batch: int) -> KVCache | PagedKVCache:
        """The preallocated cache for this batch bucket (re-made if a failed call consumed it)."""
        cache = self._caches.pop(batch, None)
        if cache is None or is_consumed(cache):
            cache = self.cache_spec.make(self.config, batch, self.max_seq_len, self.dtype)
        return cache

    def _generated(self, state: DecodeState, row: int, prompt_len: int) -> list[int]:
        length = int(state.lengths[row])
        return np.asarray(state.tokens[row, prompt_len:length]).tolist()

    def _finish(
        self, state: DecodeState, prompts: list[Prompt], ids: list[list[int]], params: list[SamplingParams]
    ) -> list[RequestOutput]:
        self._caches[state.tokens.shape[0]] = state.cache
        tokens, lengths = jax.device_get((state.tokens, state.lengths))
        outputs = []
        for i, (prompt, seq, p) in enumerate(zip(prompts, ids, params)):
            generated = tokens[i, len(seq) : lengths[i]].tolist()
            stopped = bool(generated) and generated[-1] in self._stop_ids(p)
            outputs.append(
                RequestOutput(
                    prompt=prompt if isinstance(prompt, str) else None,
                    prompt_token_ids=seq,
                    text=self._decode(generated),
                    token_ids=generated,
                    finish_reason="stop" if stopped else "length",
                )
            )
        return outputs

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""
