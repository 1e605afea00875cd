"""`LLM`'s loading steps: the weights, what prompts go through, the engine (mixed into LLM: `self` is the LLM)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxinfer.config.generation import generation_defaults
from jaxinfer.config.model import ConfigError
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine import EngineConfig, LLMEngine
from jaxinfer.engine.sync_engine import SyncLLMEngine
from jaxinfer.entrypoints.audio_prompts import AudioPrompts
from jaxinfer.entrypoints.draft_loading import engine_speculation
from jaxinfer.entrypoints.encoder_loading import check_encoder_settings, load_encoder
from jaxinfer.entrypoints.model_loading import load_sharded, model_identity, running_weights
from jaxinfer.entrypoints.multimodal import ImagePrompts, image_limit, load_vision, media_dir
from jaxinfer.entrypoints.prompt_embeds import PromptEmbeds
from jaxinfer.entrypoints.scoring import classifier_for
from jaxinfer.entrypoints.whisper_loading import check_speech_settings, is_speech_dir, load_speech
from jaxinfer.parallel.sharding import UNSHARDED
from jaxinfer.runtime.model_runner import ModelRunner
from jaxinfer.speculative.config import SpeculativeConfig

if TYPE_CHECKING:
    from jaxinfer.entrypoints.llm import LLM


class LoadingSteps:
    """The steps of `LLM.__init__` after its arguments are checked, and `plain_engine`."""

    def _load_weights(self: LLM, encoder: bool, knobs: dict[str, Any]) -> None:
        """The model's config, weights as loaded (sharded, quantized) and as they run, its mesh layout and a
        pooling model's classifier head; `knobs` are LLM's loading arguments by name."""
        self._audio = None  # an encoder-decoder speech model's encoder and its features' shape
        if is_speech_dir(self.model_dir):  # Whisper: the decoder runs in the engine, the encoder beside it
            check_speech_settings(knobs)
            self.config, weights, self._audio = load_speech(self.model_dir, self.dtype)
            self.layout, self.cpu_kernels, self._run_weights, self._engine_weights = UNSHARDED, False, weights, weights
            self.classifier = None
            return
        if encoder:
            check_encoder_settings({k: v for k, v in knobs.items() if k != "interpret_kernels"})
            self.config, weights, self.classifier = load_encoder(self.model_dir, self.dtype)
            self.layout, self.cpu_kernels, self._run_weights, self._engine_weights = UNSHARDED, False, weights, weights
            return
        self.config, weights, self.layout = load_sharded(
            self.model_dir, self.dtype, knobs["quantization"], knobs["tensor_parallel_size"],
            knobs["data_parallel_size"], knobs["quantize_lm_head"], knobs["expert_parallel_size"],
            self.runner_type == "pooling",
        )
        # A *ForSequenceClassification model's head and labels (LLM.classify, LLM.score); None for others.
        self.classifier = (classifier_for(self.model_dir, self.config.hidden_size, self.dtype, self.layout)
                           if self.runner_type == "pooling" else None)
        # What runs (`weights` gives the model's own).
        self.cpu_kernels, self._run_weights, self._engine_weights = running_weights(
            weights, self.config, self.layout, knobs["cpu_kernels"], knobs["quantized_kernel"],
            knobs["interpret_kernels"], knobs["batch_invariant"])

    def _load_inputs(self: LLM, tokenizer: Any, limit_mm_per_prompt: dict[str, int] | None,
                     allowed_local_media_path: str | Path | None, enable_prompt_embeds: bool) -> None:
        """What prompts go through before the engine: the tokenizer, a vision-language model's tower and image
        processing (entrypoints/multimodal), prompt_embeds' settings, the model's default SamplingParams."""
        self.tokenizer = tokenizer
        self._vision = load_vision(self.model_dir, self.dtype)
        # vLLM's {"prompt", "multi_modal_data": {"audio": (samples, rate)}} of a speech model (Whisper)
        self.audio_prompts = None if self._audio is None else AudioPrompts(self.model_dir, tokenizer, self._audio[1])
        self.image_prompts = ImagePrompts(self.model_dir, None if self._vision is None else self._vision[0],
                                          self.tokenizer, image_limit(limit_mm_per_prompt),
                                          media_dir(allowed_local_media_path),
                                          image_limit(limit_mm_per_prompt, "video"))
        # vLLM's prompt_embeds: [L, hidden_size] rows for a whole prompt (entrypoints/prompt_embeds)
        if enable_prompt_embeds and self.config.per_layer_input_size:
            raise ConfigError(f"enable_prompt_embeds=True is not supported for {self.config.architecture}: its "
                              "per-layer inputs read each token's id, which a prompt_embeds prompt does not have")
        self.prompt_embeds = PromptEmbeds(enable_prompt_embeds, self.config.embedding_size)
        # Used when a call passes no SamplingParams: the model's generation_config.json settings.
        self.default_params = SamplingParams(**generation_defaults(self.model_dir).sampling)

    def _start_engine(self: LLM, engine_config: EngineConfig, speculative: SpeculativeConfig | None) -> None:
        """The serving engine, speculating as `speculative` asks (a draft that cannot load leaves it
        plain: `speculation_failure` says why)."""
        self.speculative_config = speculative
        in_engine, draft, self.speculation_failure = engine_speculation(
            speculative, self.config, self._run_weights, self.tokenizer, self.dtype, self.max_seq_len,
            self.cpu_kernels, self.layout, self.model_dir,
        )
        runner = ModelRunner(
            self._engine_weights, self.config, engine_config, self.dtype, self.cache_spec, in_engine,
            None if draft is None else draft.cfg, None if draft is None else draft.weights, self.lora_config,
            self._vision, self.prompt_embeds.enabled, self._audio,
        )
        self.engine = LLMEngine(
            runner, self.tokenizer, engine_config, model_identity(self.model_dir, self.dtype), self.default_params,
            in_engine, draft,
        )
        self._front = SyncLLMEngine(self.engine)  # generate, chat and stream read their outputs through it

    def plain_engine(self: LLM, num_pages: int | None = None) -> LLMEngine:
        """A second engine on these very weights (not a copy) with no speculation and no prefix caching,
        and a page pool of its own (num_pages; None: the primary's knobs decide): the server's shadow
        reference when the served configuration differs from it only losslessly."""
        config = dataclasses.replace(self.engine.config, enable_prefix_caching=False, num_pages=num_pages)
        runner = ModelRunner(self._engine_weights, self.config, config, self.dtype, self.cache_spec)
        identity = model_identity(self.model_dir, self.dtype)
        return LLMEngine(runner, self.tokenizer, config, identity, self.default_params)
