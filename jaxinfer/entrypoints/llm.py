"""`LLM`: the notebook entry point. Loads a model once, then generates, streams or scores.

Generation runs on the serving engine (continuous batching over the paged KV cache), which also
speculates when asked: prompt lookup (n-gram, suffix) from the host, a draft model or an EAGLE
head on the device inside its verify step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from jaxinfer.checkpoint.tokenizer import load_tokenizer_beside
from jaxinfer.config import validation
from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.model import read_config_json
from jaxinfer.config.pooler import PoolerConfig, resolve_pooler
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine import EngineConfig, RequestOutput
from jaxinfer.engine.asleep import EngineAsleep
from jaxinfer.engine.prompt_checks import check_prompt
from jaxinfer.engine.spec_counters import speculation_metrics
from jaxinfer.entrypoints import weight_updates
from jaxinfer.entrypoints.call_arguments import Prompt, checked_ids, encode, params_for, priorities_for, progress_bar
from jaxinfer.entrypoints.encoder_loading import is_encoder_dir
from jaxinfer.entrypoints.llm_conversations import ConversationCalls
from jaxinfer.entrypoints.llm_loading import LoadingSteps
from jaxinfer.entrypoints.llm_pooling import PoolingCalls
from jaxinfer.entrypoints.llm_sessions import SessionCalls
from jaxinfer.entrypoints.llm_streaming import StreamCalls
from jaxinfer.entrypoints.lora_settings import lora_requests_for, lora_setting
from jaxinfer.entrypoints.model_loading import (
    resolve_dtype,
    resolve_max_seq_len,
    seq_len_setting,
)
from jaxinfer.entrypoints.multimodal import split_prompts
from jaxinfer.entrypoints.pooling import (
    check_pooling_knobs,
    not_generating,
    pooling_engine_config,
    resolve_runner,
)
from jaxinfer.entrypoints.prompt_embeds import enabled_setting
from jaxinfer.entrypoints.state_settings import (
    check_offloading,
    check_row_pages,
    check_speculation,
    prefix_caching_setting,
)
from jaxinfer.entrypoints.vllm_arguments import vllm_arguments
from jaxinfer.entrypoints.weight_updates import WeightCalls
from jaxinfer.models import Weights, unpack_for_cpu
from jaxinfer.models.encoder import EncoderWeights
from jaxinfer.models.rope import for_context
from jaxinfer.runtime.cache_spec import CacheSpec
from jaxinfer.runtime.compile_cache import compile_cache_setting
from jaxinfer.runtime.memory_maps import release_programs_near_cap
from jaxinfer.runtime.prompt_logprobs import all_position_logits
from jaxinfer.speculative.acceptance_summary import SpecMetrics
from jaxinfer.speculative.config import SpeculativeConfig
from jaxinfer.speculative.mtp import check_mtp_target
from jaxinfer.speculative.vllm_config import speculative_setting

DEMO_MODEL = Path(__file__).parents[1] / "assets" / "demo" / "target"
DEMO_DRAFT = Path(__file__).parents[1] / "assets" / "demo" / "draft"  # the demo target's speculative draft
DEMO_EAGLE = Path(__file__).parents[1] / "assets" / "demo" / "eagle"  # an EAGLE-1 head for the demo target



class LLM(LoadingSteps, ConversationCalls, PoolingCalls, WeightCalls, StreamCalls, SessionCalls):
    """A loaded model: `generate` for batches, `chat` for conversations, `stream` for outputs as they are
    produced (`stream_text` for their text), `logits` for research.

    The engine knobs follow vLLM: max_num_seqs (sequences per step), max_num_batched_tokens (tokens per step;
    longer prompts are prefilled in chunks), max_prefill_seqs (prompts prefilled per step; None: as many as the
    other two allow), num_pages or gpu_memory_utilization (the KV pool; on a GPU or TPU by default what 0.9 of
    the device's memory leaves after the weights and a step's activations), page_size (vLLM's block_size; None:
    16), enable_prefix_caching (None: on, but off for a model with Mamba2 state layers, which refuse True),
    decode_steps (decode steps one device call may run when no request is waiting) and stream_interval (vLLM's
    name: the most of them while a streamed request, `stream` or a server stream, is in the batch; None paces
    them so its tokens arrive at least every 50 ms). overlap_outputs (default True) has the engine start each
    device call before it turns the previous call's tokens into outputs, so the device works while the host
    does (vLLM's asynchronous output processing); async_scheduling (default True, with it) starts a multi-step
    decode call before the one ahead of it lands, on the tokens the device carries, so the device does not wait
    for the host between them. KV memory is held until `close()` (or the end of a `with LLM(...)` block) frees
    every cache; the object keeps working after it, re-making the caches on the next call. cpu_kernels (None:
    auto) picks the native CPU kernels; compile_cache (None: on unless JAXINFER_COMPILE_CACHE=0, or a
    directory) keeps compiled programs across processes. quantization ("int8", "int4", "fp8") quantizes the
    projections at load; quantize_lm_head=True quantizes the output head too (for a tied head a quantized copy:
    `weights` keeps the tie). quantized_kernel (None: on for one GPU) runs bf16 int8/int4 decode products
    through a Triton kernel that reads the stored values in place. tensor_parallel_size splits heads, the MLP
    and the vocabulary over that many devices and data_parallel_size splits the batch and expert_parallel_size
    a mixture-of-experts model's experts (see `jaxinfer.parallel.sharding`); with jax.distributed initialized
    the devices may span processes. max_seq_len (vLLM's name: max_model_len) is the longest prompt +
    completion. batch_invariant=True makes a request's tokens and logprobs bitwise the same whatever shares its
    steps (CPU only so far, slower: docs/engine.md). runner (vLLM's): "pooling" starts an embedding model
    (`embed`, `score`; pooler_config, vLLM's, sets its pooling) or a `*ForSequenceClassification` one
    (`classify`, `score`), "generate" a generation model, "auto" pooling for a model saved without an output
    head. enable_prompt_embeds=True (vLLM's): `generate` and `beam_search` take {"prompt_embeds": [L,
    hidden_size] tensor} prompts (docs/multimodal.md). kv_offloading_size (vLLM's): GiB of host memory keeping
    the prefix pages the KV pool evicts, copied back when a later prompt starts with them (None or 0: off;
    docs/engine.md). speculative takes a SpeculativeConfig or a dict of its fields or vLLM's keys;
    speculative_config is vLLM's name for it (`speculative.vllm_config`). seed (vLLM's): requests that give no
    seed draw theirs from a stream it seeds, so sampled outputs repeat from run to run (None: random).
    tokenizer (vLLM's): another directory to read the tokenizer from. scheduling_policy (vLLM's): "fcfs" (arrival
    order) or "priority" (`generate(priority=[...])`, lower first; docs/engine.md). Other vLLM arguments
    (docs/vllm.md) are taken where they change nothing here and refused by name where they would
    (`entrypoints.vllm_arguments`).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        dtype: str = "auto",
        max_seq_len: int | None = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 512,
        max_prefill_seqs: int | None = None,
        num_pages: int | None = None,
        gpu_memory_utilization: float | None = None,
        page_size: int | None = None,
        enable_prefix_caching: bool | None = None,
        decode_steps: int = 8,
        stream_interval: int | None = None,
        overlap_outputs: bool = True,
        async_scheduling: bool = True,
        speculative: SpeculativeConfig | dict | None = None,
        kv_cache_dtype: str = "auto",
        attention_backend: str = "auto",
        interpret_kernels: bool = False,
        cpu_kernels: bool | None = None,
        compile_cache: bool | str | Path | None = None,
        quantization: str | None = None,
        quantize_lm_head: bool = False,
        quantized_kernel: bool | None = None,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        expert_parallel_size: int = 1,
        max_model_len: int | None = None,
        batch_invariant: bool = False,
        enable_lora: bool = False,
        max_loras: int = 1,
        max_lora_rank: int = 16,
        runner: str = "auto",
        pooler_config: PoolerConfig | dict | None = None,
        limit_mm_per_prompt: dict[str, int] | None = None,
        allowed_local_media_path: str | Path | None = None,
        enable_prompt_embeds: bool = False,
        kv_offloading_size: float | None = None,
        speculative_config: SpeculativeConfig | dict | None = None,
        seed: int | None = None,
        tokenizer: str | Path | None = None,
        scheduling_policy: str = "fcfs",
        **vllm_engine_args: Any,
    ):
        self.model_dir = validation.model_dir(DEMO_MODEL if model is None else model, "model")
        page_size = vllm_arguments(vllm_engine_args, dict(page_size=page_size)).get("page_size", page_size) or 16
        self.runner_type = resolve_runner(runner, self.model_dir)  # "generate" or "pooling" (entrypoints/pooling)
        pooler_config = PoolerConfig.of(pooler_config)
        if self.runner_type == "pooling":
            check_pooling_knobs(speculative, enable_lora)
        batch_invariant = validation.boolean(batch_invariant, "batch_invariant")  # before minutes of loading
        self.lora_config = lora_setting(enable_lora, max_loras, max_lora_rank, batch_invariant)
        max_seq_len = seq_len_setting(max_seq_len, max_model_len)
        compile_cache_setting(compile_cache)
        release_programs_near_cap()  # loading compiles programs too, each mapped on CPU (see memory_maps)
        speculative = speculative_setting(speculative, speculative_config)
        enable_prompt_embeds = enabled_setting(enable_prompt_embeds, speculative)
        self.dtype = resolve_dtype(dtype, self.model_dir)
        tokenizer = load_tokenizer_beside(self.model_dir if tokenizer is None else
                                          validation.model_dir(tokenizer, "tokenizer"))
        encoder = is_encoder_dir(self.model_dir)  # BERT, RoBERTa, XLM-R: pooled passes only (encoder_loading)
        self._load_weights(encoder, dict(
            quantization=quantization, quantize_lm_head=quantize_lm_head, tensor_parallel_size=tensor_parallel_size,
            data_parallel_size=data_parallel_size, expert_parallel_size=expert_parallel_size,
            batch_invariant=batch_invariant, cpu_kernels=cpu_kernels, quantized_kernel=quantized_kernel,
            interpret_kernels=interpret_kernels, kv_cache_dtype=kv_cache_dtype))
        # LLM.embed's settings (a generation model's too: its final hidden states pooled as asked).
        self.pooler = resolve_pooler(self.model_dir, read_config_json(self.model_dir), pooler_config,
                                     self.config.embedding_size, "cls" if encoder else "last")
        self._quantized_kernel = quantized_kernel  # weights given later are shaped to run as these were
        self._weight_state = weight_updates.WeightState()  # update_weights' and sleep's
        self.max_seq_len = resolve_max_seq_len(max_seq_len, self.config.max_position_embeddings)
        self.config = for_context(self.config, self.max_seq_len)  # LongRoPE's factors for this context
        check_row_pages(kv_cache_dtype, self.config)
        self.cache_spec = CacheSpec(
            page_size, kv_cache_dtype, attention_backend, interpret_kernels, cpu_kernels=self.cpu_kernels,
            mesh_layout=self.layout, batch_invariant=batch_invariant,
        )
        self._load_inputs(tokenizer.result(), limit_mm_per_prompt, allowed_local_media_path, enable_prompt_embeds)
        engine_config = EngineConfig(
            max_seq_len=self.max_seq_len, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_prefill_seqs=max_prefill_seqs, num_pages=num_pages,
            gpu_memory_utilization=gpu_memory_utilization, page_size=page_size,
            enable_prefix_caching=prefix_caching_setting(enable_prefix_caching, self.config),
            decode_steps=decode_steps,
            stream_interval=stream_interval, overlap_outputs=overlap_outputs, async_scheduling=async_scheduling,
            kv_offloading_size=check_offloading(kv_offloading_size, self.config), seed=seed,
            scheduling_policy=scheduling_policy,
        )
        check_speculation(speculative, self.config)
        if speculative is not None and speculative.method == "mtp" and not speculative.reads_target_kv:
            check_mtp_target(self.config)  # the target's own MTP layers (a Gemma 4 assistant is checked as loaded)
        if self.runner_type == "pooling":
            engine_config = pooling_engine_config(engine_config)
        self._weights_fingerprint: str | None = None  # see save_session
        self._start_engine(engine_config, speculative)

    @property
    def weights(self) -> Weights:
        """The model's weights pytree (what `save_converted` writes); unpacked on each access when packed."""
        if isinstance(self._run_weights, EncoderWeights):  # an encoder's run as loaded
            return self._run_weights
        return unpack_for_cpu(self._run_weights, self.config.tie_word_embeddings)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for one prompt or many (str, token ids, or vLLM's dict {"prompt" or "prompt_token_ids",
        "multi_modal_data": {"image": ...}} for a vision-language model: docs/multimodal.md; or {"prompt_embeds":
        [L, hidden_size] tensor} with enable_prompt_embeds=True); one output per prompt, in order.

        use_tqdm=True shows a progress bar over the requests on stderr. lora_request (vLLM's): the
        LoRA adapter every prompt runs with, or one per prompt (None: the base model); needs
        enable_lora=True. priority (vLLM's): one integer per prompt, lower served first; needs
        scheduling_policy="priority".
        """
        self._check_generating("LLM.generate")
        prompts, images = self._split_prompts(prompts)
        prompts = self._as_list(prompts)
        params_list = self._params_for(prompts, sampling_params)
        adapters = lora_requests_for(lora_request, len(prompts))
        priorities = priorities_for(priority, len(prompts))
        bar = progress_bar(use_tqdm, len(prompts), "Processed prompts", "req")
        try:
            return self._engine_generate(prompts, params_list, bar.update, adapters, images, priorities)
        finally:
            bar.close()

    def _split_prompts(self, prompts: Any) -> tuple[Any, list[tuple] | None]:
        """vLLM's dict prompts as (ids, each one's images); a speech model's carry their audio instead
        (entrypoints/audio_prompts)."""
        if self.audio_prompts is not None:
            return self.audio_prompts.split(prompts)
        return split_prompts(prompts, self.image_prompts, self.prompt_embeds)

    def _engine_generate(
        self, prompts: list[Prompt], params: list[SamplingParams], on_finished: Callable[[int], object] | None = None,
        lora_requests: list[LoRARequest | None] | None = None, images: list[tuple] | None = None,
        priorities: list[int] | None = None,
    ) -> list[RequestOutput]:
        """The requests run to the end on the engine (draft-model and EAGLE ones too), outputs in order."""
        added = self._front.add(prompts, params, final_only=True, lora_requests=lora_requests, images=images,
                                priorities=priorities)
        return self._front.run(added, on_finished)

    def get_tokenizer(self) -> Any:
        """The model's HF tokenizer (vLLM's name); a model directory without tokenizer files has none."""
        if self.tokenizer is None:
            raise ValueError(f"{self.model_dir} has no tokenizer files (tokenizer.json, tokenizer.model or "
                             "tokenizer_config.json); pass token ids to generate")
        return self.tokenizer

    def metrics(self) -> dict:
        """Engine metrics (vLLM names), plus the speculative totals (drafted, accepted, ...) when configured."""
        out = self.engine.metrics()
        out.update(self.engine.speculation_metrics() or self._failed_speculation_metrics())
        return out

    def _failed_speculation_metrics(self) -> dict:
        """Speculation's metrics when its draft failed to load: off, why, and no drafts."""
        config = self.speculative_config
        if self.speculation_failure is None or config is None:
            return {}
        return speculation_metrics(config, False, self.speculation_failure, SpecMetrics(config.num_speculative_tokens))

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix (vLLM's), e.g. between benchmark runs or after changing weights."""
        self.engine.reset_prefix_cache()
        return True

    def start_profile(self, trace_dir: str | Path | None = None) -> Path:
        """Start a device trace (vLLM's `start_profile`, through jax.profiler) into trace_dir or
        $JAXINFER_PROFILER_DIR; returns the directory. Perfetto opens its trace.json.gz, XProf and
        TensorBoard its xplane.pb."""
        return self.engine.start_profile(trace_dir)

    def stop_profile(self) -> Path:
        """Wait for the call in flight, stop the trace and write it; returns its directory."""
        return self.engine.stop_profile()

    def close(self) -> None:
        """Free the KV caches: the engine's page pools (the target's and a draft model's or EAGLE head's).

        The weights stay loaded, so the object still works after close(): the next call re-makes
        the caches it needs. A generator from `stream` must be closed or exhausted first.
        """
        self.engine.release()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Float32 next-token logits [len(token_ids), vocab] at every position of one sequence."""
        self._check_generating("LLM.logits (the output head's)")
        if self.engine.no_weights is not None:
            raise EngineAsleep(str(self.engine.no_weights), self.engine.no_weights.level)
        token_ids = validation.token_ids(token_ids, "token_ids", self.config.vocab_size)
        check_prompt(token_ids, 0, self.config.vocab_size, self.max_seq_len)
        release_programs_near_cap()
        return all_position_logits(
            self._engine_weights, self.config, token_ids, self.dtype, self.max_seq_len, self.cpu_kernels, self.layout,
            self.engine.runner.executables,
        )

    def tokenize(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt (strings go through the model's tokenizer; ids and TokensPrompts are checked
        against the vocabulary). `encode` is vLLM's pooling call (entrypoints/llm_pooling)."""
        return encode(prompt, self.tokenizer, self.model_dir, self.config.vocab_size)

    def _check_generating(self, what: str) -> None:
        if self.runner_type == "pooling":
            raise not_generating(what)

    def _checked_ids(self, prompts: Prompt | Sequence[Prompt], max_tokens: int) -> list[list[int]]:
        return checked_ids(self._as_list(prompts), self.tokenizer, self.model_dir, self.config.vocab_size,
                           self.max_seq_len, max_tokens)

    def _as_list(self, prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
        return validation.prompts(prompts, "prompts", self.config.vocab_size)

    def _params_for(
        self, prompts: list[Prompt], params: SamplingParams | Sequence[SamplingParams] | None
    ) -> list[SamplingParams]:
        return params_for(prompts, params, self.default_params, self.config.vocab_size)
