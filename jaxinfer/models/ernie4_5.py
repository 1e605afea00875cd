"""Baidu ERNIE 4.5 dense (Ernie4_5ForCausalLM: ERNIE-4.5-0.3B): the Llama layer with GLM's rotation layout.

Rotary embeddings turn every head dim in adjacent pairs (2i, 2i + 1) rather than the two halves
(`cfg.rope_interleaved`). One flag, `use_bias`, would bias every projection, the MLP's too; no
released checkpoint sets it and the MLP has no biases here, so it is refused. The head is tied by
default, heads are `head_dim` wide (128 unless set) and theta is 500000 unless set, as
transformers' Ernie4_5Config reads a config. The MoE models (`ernie4_5_moe.py`) read their
attention fields here too.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.family import Family
from jaxinfer.models.llama import abstract_layer, decoder_layer, hf_leaves

ARCHITECTURES = ("Ernie4_5ForCausalLM",)
# Ernie4_5Config's defaults for fields a config leaves out (a null head_dim or num_key_value_heads still falls
# back to hidden_size / heads and to heads, as transformers reads it); theta as its `default_theta`.
DEFAULTS = dict(num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-5, max_position_embeddings=131072,
                tie_word_embeddings=True, rope_theta=500000.0, bos_token_id=1, eos_token_id=2)


def ernie_fields(hf: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """The ModelConfig fields both ERNIE 4.5 architectures read alike (hf with its defaults filled in)."""
    if hf.get("use_bias"):
        raise ConfigError(f"use_bias=True is not supported for {arch}: it biases the MLPs too (no released "
                          "checkpoint sets it)")
    fields = common_fields(hf, arch)
    return dict(
        **fields,
        rope_interleaved=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an ERNIE 4.5 dense HF config."""
    return ModelConfig(**ernie_fields({**DEFAULTS, **hf}, arch))


FAMILY = Family("ernie4_5", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
