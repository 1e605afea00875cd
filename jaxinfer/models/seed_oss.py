"""ByteDance Seed-OSS (SeedOssForCausalLM: Seed-OSS-36B): the Llama layer with its own attention biases.

q/k/v are biased (`attention_bias`, on by default) and the output projection only where
`attention_out_bias` says so (off by default); heads are `head_dim` wide (128 by default, not
hidden_size / heads). Rotary embeddings, norms, the MLP and the checkpoint names are Llama's.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.family import Family
from jaxinfer.models.llama import abstract_layer, decoder_layer, hf_leaves

ARCHITECTURES = ("SeedOssForCausalLM",)
# SeedOssConfig's defaults for fields a config leaves out (a null head_dim or num_key_value_heads still
# falls back to hidden_size / heads and to heads, as common_fields and transformers read it).
DEFAULTS = dict(num_key_value_heads=8, head_dim=128, max_position_embeddings=524288, attention_bias=True,
                bos_token_id=0, eos_token_id=2)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Seed-OSS HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    return ModelConfig(
        **fields,
        qkv_bias=bool(hf["attention_bias"]),
        o_bias=bool(hf.get("attention_out_bias", False)),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("seed_oss", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
