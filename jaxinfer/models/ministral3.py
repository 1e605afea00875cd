"""Mistral AI's Ministral 3 text decoder (Ministral3ForCausalLM): Mistral's layer with Llama 4's query temperature.

The layer, weights and checkpoint names are Llama's (`llama.py`), with Mistral's optional uniform
`sliding_window`; what differs is in the attention and the defaults. After the rotary embedding each
query is scaled by 1 + beta * log(1 + floor(position / original_max_position_embeddings)), beta
being `rope_parameters.llama_4_scaling_beta` (Llama 4's attention temperature tuning, so attention
stays sharp past the pretraining context; 1 within it). A config without rope parameters takes
Ministral3Config's: YaRN with factor 16 over 16384 positions, theta 1e6, beta 0.1; head_dim 128.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import (
    ConfigError,
    ModelConfig,
    activation_name,
    common_fields,
    field,
    uniform_windows,
)
from jaxinfer.models.family import Family
from jaxinfer.models.llama import abstract_layer, decoder_layer, hf_leaves

ARCHITECTURES = ("Ministral3ForCausalLM",)
# Ministral3Config's defaults for fields a config leaves out.
DEFAULTS = dict(num_key_value_heads=8, head_dim=128, max_position_embeddings=262144, rms_norm_eps=1e-5,
                bos_token_id=1, eos_token_id=2)
DEFAULT_ROPE = dict(rope_type="yarn", rope_theta=1e6, factor=16.0, original_max_position_embeddings=16384,
                    beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1)
SCALED_ROPE_TYPES = ("yarn", "llama3")  # the types whose parameters carry original_max_position_embeddings


def rope_parameters(hf: Mapping[str, Any], default: Mapping[str, Any] = DEFAULT_ROPE) -> dict[str, Any]:
    """The rope parameters transformers runs: the config's own, else `default` (Ministral3Config's; ignoring a
    bare `rope_theta`, as transformers does)."""
    params = {**(hf.get("rope_parameters") or {}), **(hf.get("rope_scaling") or {})}
    return params or dict(default)


def query_scale_beta(params: Mapping[str, Any], rope_type: str, arch: str = ARCHITECTURES[0]) -> float:
    """`llama_4_scaling_beta`, checked: `arch`'s attention reads it and original_max_position_embeddings."""
    beta = params.get("llama_4_scaling_beta")
    if isinstance(beta, bool) or not isinstance(beta, (int, float)):
        raise ConfigError(f"rope_parameters.llama_4_scaling_beta {beta!r} is not supported: {arch} "
                          "scales queries by it; give a number (0 for no scaling)")
    if rope_type not in SCALED_ROPE_TYPES:
        raise ConfigError(f"rope type {rope_type!r} is not supported for {arch}: its query scaling "
                          f"reads original_max_position_embeddings, which only {', '.join(SCALED_ROPE_TYPES)} carry")
    return float(beta)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Ministral 3 HF config."""
    hf = {**DEFAULTS, **hf}
    params = rope_parameters(hf)
    fields = common_fields({**hf, "rope_parameters": params, "rope_scaling": None}, arch)
    scaling = fields["rope_scaling"]
    window = int(field(hf, "sliding_window", 0))
    return ModelConfig(
        **fields,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], window),
        query_scale_beta=query_scale_beta(params, scaling.rope_type),
        query_scale_period=scaling.original_max_position_embeddings,
    )


FAMILY = Family("ministral3", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
