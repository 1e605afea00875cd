"""Ministral (MinistralForCausalLM: Ministral-8B-Instruct-2410): the Llama layer with sliding windows by layer.

The layers `layer_types` marks sliding attend over the last `sliding_window` tokens, the others
over everything; a config without layer_types slides in every layer when it sets a window (Mistral's
4096 by default) and in none without one, as transformers reads it. No projection is biased and
heads are `head_dim` wide; norms, rope, the MLP and checkpoint names are Llama's.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, layer_types
from jaxinfer.models.family import Family
from jaxinfer.models.llama import abstract_layer, decoder_layer, hf_leaves

ARCHITECTURES = ("MinistralForCausalLM",)
# MinistralConfig's defaults (Mistral's) for fields a config leaves out (where common_fields' differ).
DEFAULTS = dict(num_key_value_heads=8, sliding_window=4096, max_position_embeddings=4096 * 32, bos_token_id=1,
                eos_token_id=2)


def typed_windows(hf: Mapping[str, Any], arch: str, num_layers: int, default_types: list[str]) -> tuple[int, ...]:
    """`sliding_window` on the layers `layer_types` (else `default_types`) marks sliding, 0 (full) on the others;
    ConfigError when a sliding layer has no positive window."""
    types = layer_types(hf, num_layers) or default_types
    window = int(field(hf, "sliding_window", 0))
    if window < 1 and "sliding_attention" in types:
        raise ConfigError(f"sliding_window {hf.get('sliding_window')!r} is not supported for {arch}'s sliding layers "
                          "(layer_types): give a window >= 1, or full_attention layer_types")
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Ministral HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    default = "sliding_attention" if field(hf, "sliding_window") is not None else "full_attention"
    return ModelConfig(
        **fields,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=typed_windows(hf, arch, fields["num_layers"], [default] * fields["num_layers"]),
    )


FAMILY = Family("ministral", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
