"""Encoder-only models (BERT, RoBERTa, XLM-RoBERTa): which HF architectures are encoders, and their
`config.json` read into one hashable `EncoderConfig`. No jax.

Encoders are bidirectional and never generate, so they are not a decoder family of the registry: they
run only as pooling models (`LLM(runner="pooling")`: embeddings, classify, score) through
`models/encoder`. What jaxinfer does not run (relative position embeddings, a decoder or cross-attention
configuration, an activation it does not know) is refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.config.model import REQUIRED_FIELDS, ConfigError, ModelConfig

# architecture -> (the layout its embeddings and tensors follow, the head it carries: None for a base model)
ENCODERS = {
    "BertModel": ("bert", None),
    "BertForSequenceClassification": ("bert", "bert"),
    "RobertaModel": ("roberta", None),
    "RobertaForSequenceClassification": ("roberta", "roberta"),
    "XLMRobertaModel": ("roberta", None),
    "XLMRobertaForSequenceClassification": ("roberta", "roberta"),
}
# HF activation name -> (jax.nn.gelu's approximate, or "relu")
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Shape and numerics of one encoder; hashable (a static part of its weights' tree).

    layout "bert": positions 0, 1, ... and token types from the ids (see models/encoder.TYPE_SHIFT);
    "roberta": positions count the non-pad tokens from pad_token_id + 1 (fairseq's, as HF computes them),
    token type 0 everywhere. head: None (a base model), "bert" (pooler dense + tanh on the first token,
    then `classifier`) or "roberta" (`classifier.dense` + tanh on the first token, then `out_proj`)."""

    architecture: str
    layout: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    max_len: int  # tokens a prompt may have: max_position_embeddings less RoBERTa's offset
    position_offset: int  # RoBERTa: pad_token_id + 1, the first real token's position row
    pad_token_id: int
    type_vocab_size: int
    layer_norm_eps: float
    activation: str
    head: str | None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def token_types(self) -> bool:
        """Whether the ids carry token types (BERT's segment embeddings: a cross-encoder's second text)."""
        return self.layout == "bert" and self.type_vocab_size > 1


def is_encoder(architecture: str) -> bool:
    """Whether `architecture` names an encoder-only model jaxinfer runs (models/encoder)."""
    return architecture in ENCODERS


def read_encoder_config(hf: Mapping[str, Any]) -> EncoderConfig:
    """An encoder's config.json (`hf`) as an EncoderConfig; ConfigError naming what it cannot run."""
    arch = (hf.get("architectures") or [""])[0]
    if arch not in ENCODERS:
        raise ConfigError(f"architecture {arch!r} is not an encoder jaxinfer runs; encoders: {', '.join(ENCODERS)}")
    missing = [key for key in (*REQUIRED_FIELDS, "max_position_embeddings") if hf.get(key) is None]
    if missing:
        raise ConfigError(f"no {', '.join(missing)}; an HF config of a {arch} model sets them")
    _refuse(hf, "position_embedding_type", "absolute", "absolute position embeddings only (relative_key and "
            "relative_key_query attention biases are not supported)")
    _refuse(hf, "is_decoder", False, "a bidirectional encoder (is_decoder=True makes BERT causal)")
    _refuse(hf, "add_cross_attention", False, "an encoder without cross-attention")
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ConfigError(f"hidden_act {act!r} is not supported for {arch}; supported: {', '.join(ACTIVATIONS)}")
    layout, head = ENCODERS[arch]
    pad = int(hf.get("pad_token_id") if hf.get("pad_token_id") is not None else (1 if layout == "roberta" else 0))
    offset = pad + 1 if layout == "roberta" else 0
    hidden, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    if hidden % heads:
        raise ConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    return EncoderConfig(
        arch, layout, int(hf["vocab_size"]), hidden, int(hf["intermediate_size"]), int(hf["num_hidden_layers"]),
        heads, int(hf["max_position_embeddings"]) - offset, offset, pad, int(hf.get("type_vocab_size", 2)),
        float(hf.get("layer_norm_eps", 1e-12)), ACTIVATIONS[act], head,
    )


def _refuse(hf: Mapping[str, Any], field: str, accepted: Any, runs: str) -> None:
    """ConfigError when `field` is set to anything but `accepted`."""
    value = hf.get(field, accepted)
    if value is not None and value != accepted:
        raise ConfigError(f"{field}={value!r} is not supported: jaxinfer runs {runs}; accepted: {accepted!r}")


def engine_shape(cfg: EncoderConfig) -> ModelConfig:
    """The ModelConfig the serving engine keeps for an encoder: its real sizes (the engine's one-sequence KV
    pool and the prompt checks read them); no decoder family runs it."""
    return ModelConfig(
        architecture=cfg.architecture, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_layers=cfg.num_layers, num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_heads, head_dim=cfg.head_dim, max_position_embeddings=cfg.max_len,
        tie_word_embeddings=True,
    )
