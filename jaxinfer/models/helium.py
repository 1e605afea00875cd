"""Kyutai's Helium (HeliumForCausalLM: helium-1-2b): the Llama layer with rope in adjacent pairs.

Rotary embeddings turn adjacent pairs of dims (2i, 2i + 1) over the whole head (GLM's layout,
`cfg.rope_interleaved`); the RMSNorms scale by their weight in float32 before the cast (Gemma 4's
order, `cfg.norm_scale_first`), with an epsilon of 1e-8 by default; q/k/v are biased under
`attention_bias`, the output projection never. Its output projection maps hidden_size to
hidden_size, so heads times head_dim must be hidden_size. Fields a config leaves out take
HeliumConfig's defaults (theta 100000, head_dim 128, 20 KV heads).
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.family import Family
from jaxinfer.models.llama import abstract_layer, decoder_layer, hf_leaves

ARCHITECTURES = ("HeliumForCausalLM",)
# HeliumConfig's defaults for fields a config leaves out (where common_fields' differ).
DEFAULTS = dict(rope_theta=100000.0, num_key_value_heads=20, head_dim=128, rms_norm_eps=1e-8, bos_token_id=1,
                eos_token_id=2)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Helium HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    if fields["num_heads"] * fields["head_dim"] != fields["hidden_size"]:
        raise ConfigError(f"head_dim {fields['head_dim']} is not supported for {arch} with {fields['num_heads']} "
                          f"heads: its o_proj maps hidden_size to hidden_size, so heads x head_dim must be "
                          f"{fields['hidden_size']}")
    return ModelConfig(
        **fields,
        qkv_bias=bool(hf.get("attention_bias", False)),
        rope_interleaved=True,
        norm_scale_first=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("helium", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
