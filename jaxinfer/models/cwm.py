"""Meta's Code World Model (CwmForCausalLM: facebook/cwm): the Llama layer with sliding windows by layer.

Every fourth layer from the first attends over everything and the others over the last
`sliding_window` tokens (8192), unless `layer_types` says otherwise; Llama 3's rope (theta 1e6,
factor 16 over 8192 original positions) where a config gives no rope parameters. No projection is
biased; norms, the MLP and checkpoint names are Llama's. Fields a config leaves out take CwmConfig's defaults.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ModelConfig, activation_name, common_fields
from jaxinfer.models.family import Family
from jaxinfer.models.llama import abstract_layer, decoder_layer, hf_leaves
from jaxinfer.models.ministral import typed_windows

ARCHITECTURES = ("CwmForCausalLM",)
FULL_EVERY = 4  # transformers' default pattern: layers 0, 4, 8, ... attend over everything
DEFAULT_ROPE = dict(rope_type="llama3", rope_theta=1e6, factor=16.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)
# CwmConfig's defaults for fields a config leaves out (where common_fields' differ).
DEFAULTS = dict(rope_theta=1e6, num_key_value_heads=8, head_dim=128, sliding_window=8192,
                max_position_embeddings=131072, rms_norm_eps=1e-5, bos_token_id=128000,
                eos_token_id=[128001, 128008, 128009])


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a CWM HF config."""
    hf = {**DEFAULTS, **hf}
    if not hf.get("rope_parameters") and not hf.get("rope_scaling"):  # even beside a top-level rope_theta, as in
        hf["rope_parameters"] = DEFAULT_ROPE  # transformers
    fields = common_fields(hf, arch)
    default_types = ["full_attention" if i % FULL_EVERY == 0 else "sliding_attention"
                     for i in range(fields["num_layers"])]
    return ModelConfig(
        **fields,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=typed_windows(hf, arch, fields["num_layers"], default_types),
    )


FAMILY = Family("cwm", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
