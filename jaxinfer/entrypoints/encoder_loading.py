"""Loading an encoder-only model (BERT, RoBERTa, XLM-RoBERTa: models/encoder_config) for `LLM`: its weights,
a sequence classifier's head and labels, and the ModelConfig the engine keeps.

An encoder runs only as a pooling model, on one device, unquantized, in the pooled passes of
runtime/embeddings; the knobs that shape a decoder's weights or steps are refused by name. Its engine
holds the one-sequence KV pool every pooling model's engine holds (entrypoints/pooling), never used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, NamedTuple

from jaxinfer.checkpoint.encoder_weights import EncoderTensors, head_rows, load_encoder_head, load_encoder_weights
from jaxinfer.checkpoint.loader import safetensors_index
from jaxinfer.checkpoint.score_head import Classifier, labels_of
from jaxinfer.config.model import ConfigError, ModelConfig, read_config_json
from jaxinfer.models.encoder import EncoderWeights
from jaxinfer.models.encoder_config import engine_shape, is_encoder, read_encoder_config

# LLM argument -> the values an encoder runs with (each other value shapes a decoder's weights or steps)
PLAIN = {"quantization": (None,), "quantize_lm_head": (False,), "tensor_parallel_size": (1,),
         "data_parallel_size": (1,), "expert_parallel_size": (1,), "batch_invariant": (False,),
         "cpu_kernels": (None, False), "quantized_kernel": (None, False)}


class LoadedEncoder(NamedTuple):
    """What `LLM` keeps of an encoder."""

    config: ModelConfig  # the engine's view: sizes and the longest prompt
    weights: EncoderWeights
    classifier: Classifier | None  # a *ForSequenceClassification checkpoint's head


def is_encoder_dir(model_dir: Path) -> bool:
    """Whether the checkpoint in `model_dir` is an encoder (its config.json's one architecture)."""
    archs = read_config_json(model_dir).get("architectures") or []
    return len(archs) == 1 and is_encoder(archs[0])


def check_encoder_settings(settings: Mapping[str, Any]) -> None:
    """Refuse, by name, LLM arguments an encoder does not run with (see PLAIN)."""
    for name, accepted in PLAIN.items():
        if name in settings and settings[name] not in accepted:
            raise ValueError(f"{name}={settings[name]!r} is not supported for encoder models (BERT, RoBERTa, "
                             f"XLM-RoBERTa), which run unquantized on one device in pooled passes; accepted: "
                             f"{' or '.join(map(repr, accepted))}")


def refuse_weight_calls(weights: Any, what: str) -> None:
    """Refuse `what` (a weight update or sleep: they swap or move a decoder's leaves) on an encoder, by name."""
    if isinstance(weights, EncoderWeights):
        raise ValueError(f"{what} is not supported for encoder models (BERT, RoBERTa, XLM-RoBERTa): it swaps or "
                         "moves a decoder's weight leaves; start a new LLM on the new checkpoint instead")


def load_encoder(model_dir: Path, dtype: Any) -> LoadedEncoder:
    """An encoder checkpoint's weights in `dtype`, its head if it classifies, and the engine's ModelConfig."""
    hf = read_config_json(model_dir)
    try:
        cfg = read_encoder_config(hf)
    except ConfigError as err:  # the dict-level message, with the file it came from
        raise ConfigError(f"{model_dir / 'config.json'}: {err}") from None
    tensors = EncoderTensors(model_dir, safetensors_index(model_dir), dtype)
    classifier = None
    if cfg.head is not None:
        rows = head_rows(tensors, cfg)
        pad = hf.get("pad_token_id")
        classifier = Classifier(load_encoder_head(tensors, cfg, rows), labels_of(hf, rows, model_dir / "config.json"),
                                pad if isinstance(pad, int) else None, cfg.token_types)
    return LoadedEncoder(engine_shape(cfg), load_encoder_weights(tensors, cfg), classifier)
