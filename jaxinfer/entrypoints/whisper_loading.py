"""An encoder-decoder speech checkpoint (Whisper) for `LLM`: the decoder's config and weights the engine runs,
the encoder and its features' shape (runtime/audio_runner), and what it does not run refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp

from jaxinfer.checkpoint.whisper_weights import as_dtype, audio_encoder, decoder_weights, tensor_reader
from jaxinfer.config.model import ConfigError, ModelConfig, read_config_json
from jaxinfer.models.decoder import Weights
from jaxinfer.models.registry import load_config
from jaxinfer.models.whisper import ARCHITECTURES
from jaxinfer.models.whisper_encoder import AudioEncoder

# LLM's loading arguments this model runs without, with the value it needs
# (kv_cache_dtype: the cross-attention pages hold the encoder's keys and values unquantized, cache/cross_pool)
PLAIN = dict(quantization=None, quantize_lm_head=False, tensor_parallel_size=1, data_parallel_size=1,
             expert_parallel_size=1, batch_invariant=False, kv_cache_dtype="auto")


def is_speech_dir(model_dir: Path) -> bool:
    """Whether the checkpoint is an encoder-decoder speech model (Whisper)."""
    return (read_config_json(model_dir).get("architectures") or [None])[0] in ARCHITECTURES


def check_speech_settings(knobs: dict[str, Any]) -> None:
    """ConfigError naming a loading argument a speech model does not run with."""
    for name, plain in PLAIN.items():
        if knobs.get(name, plain) != plain:
            raise ConfigError(f"{name}={knobs[name]!r} is not supported for Whisper yet; leave it at {plain!r}")
    if knobs.get("cpu_kernels"):
        raise ConfigError("cpu_kernels=True is not supported for Whisper yet; leave it unset or False")


def refuse_speech_weight_calls(audio: Any, what: str) -> None:
    """Refuse `what` (a weight update, or sleep(level=2), which needs one) on a speech model, by name: the
    encoder and each decoder layer's cross-attention k/v projections (`AudioEncoder`) live beside the
    decoder's `Weights` those calls swap, so a new checkpoint would be half served."""
    if audio is not None:
        raise ValueError(f"{what} is not supported for Whisper yet: it swaps the decoder's weights, while the "
                         "encoder and the cross-attention k/v projections live beside them (a new checkpoint would "
                         "be half served); start a new LLM on the new checkpoint (sleep(level=1) and wake_up work)")


def load_speech(model_dir: Path, dtype: jnp.dtype) -> tuple[ModelConfig, Weights, tuple[AudioEncoder, tuple[int, int]]]:
    """(the decoder's config, its weights, (the encoder, its features' (mel bins, frames)))."""
    cfg = load_config(model_dir)
    hf = read_config_json(model_dir)
    read = tensor_reader(model_dir)
    encoder = audio_encoder(read, cfg, int(hf["encoder_layers"]), int(hf["encoder_attention_heads"]))
    shape = (int(hf.get("num_mel_bins") or 80), 2 * cfg.encoder_frames)
    return cfg, as_dtype(decoder_weights(read, cfg), dtype), (as_dtype(encoder, dtype), shape)
