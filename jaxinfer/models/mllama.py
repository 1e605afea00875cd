"""Llama 3.2 Vision's language model (`MllamaForCausalLM`, `MllamaForConditionalGeneration`), text in, text out.

Mllama's text model is Llama 3's decoder in which the layers `cross_attention_layers` names are gated
cross-attention layers over an image's projected vision states instead of self-attention layers. transformers
skips those layers entirely when a prompt has no image (no cross-attention states, nothing cached), so for text
the model is Llama 3's self-attention layers alone. That is what runs here: a cross-attention layer is a
`SkippedLayer` (no leaves read, no K/V pages kept: `cfg.mlp_only_layers`), the rest Llama's layer. The embedding
stores vocab_size + 8 rows (the `<|image|>` token and reserved ids past the vocabulary: `cfg.stored_vocab_size`,
the first vocab_size read, so a prompt holding the image token is refused as outside the vocabulary); the
untied head has vocab_size rows. The conditional-generation checkpoint keeps its text model under
`language_model.` beside the vision tower and projector, skipped at load (models/text_part): its images are
refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

import jaxinfer.models.llama as llama
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family
from jaxinfer.models.rope import RopeTables

ARCHITECTURES = ("MllamaForCausalLM", "MllamaForConditionalGeneration")
STORED_EXTRA_ROWS = 8  # transformers' MllamaTextModel embeds vocab_size + 8 ids (<|image|> is vocab_size)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SkippedLayer:
    """A cross-attention layer as a text prompt runs it: not at all (transformers skips it without an image)."""

    PROJECTIONS: ClassVar[dict[str, int]] = {}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = ()


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Any:
    """Layer `layer`'s leaves: Llama's, or none for a cross-attention layer."""
    return SkippedLayer() if layer in cfg.mlp_only_layers else llama.abstract_layer(cfg, layer)


def decoder_layer(cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
                  rope: RopeTables) -> tuple[jax.Array, Any]:
    """Llama's layer; a cross-attention layer leaves the residual stream as it is (text has no image to attend)."""
    if isinstance(lw, SkippedLayer):
        return x, cache
    return llama.decoder_layer(cfg, x, cache, lw, layer, positions, rope)


def cross_attention_layers(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """The config's `cross_attention_layers`, checked to be layers of the model."""
    layers = field(hf, "cross_attention_layers", [])
    if not isinstance(layers, list) or any(not isinstance(i, int) or not 0 <= i < num_layers for i in layers):
        raise ConfigError(f"cross_attention_layers {layers!r} is not supported: give a list of layer indices in "
                          f"[0, {num_layers})")
    return tuple(sorted(set(layers)))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an Mllama text config (the conditional-generation checkpoint's `text_config`)."""
    fields = common_fields(hf, arch)
    hidden, heads = fields["hidden_size"], fields["num_heads"]
    if hidden % heads:  # transformers' head_dim is hidden_size // num_attention_heads, whatever the config says
        raise ConfigError(f"hidden_size ({hidden}) must be a multiple of num_attention_heads ({heads}) for {arch}")
    layers = fields["num_layers"]
    return ModelConfig(
        **{**fields, "head_dim": hidden // heads},
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, layers, 0),
        mlp_only_layers=cross_attention_layers(hf, layers),
        stored_vocab_size=fields["vocab_size"] + STORED_EXTRA_ROWS,
    )


FAMILY = Family("mllama", ARCHITECTURES, read_config, abstract_layer, llama.hf_leaves, decoder_layer)
