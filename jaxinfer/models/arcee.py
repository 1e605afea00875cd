"""Arcee's AFM (ArceeForCausalLM: AFM-4.5B): the Llama layer with an ungated ReLU^2 MLP.

The MLP is down(relu(up(x)) ** 2) (`models.ungated_mlp`), with no gate projection; attention,
norms, rope (YaRN in the released model) and checkpoint names are Llama's. Fields a config
leaves out take transformers' ArceeConfig defaults (relu2, rms_norm_eps 1e-5, untied head).
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.family import Family
from jaxinfer.models.ungated_mlp import abstract_layer, decoder_layer, hf_leaves

ARCHITECTURES = ("ArceeForCausalLM",)
# ArceeConfig's defaults for fields a config leaves out (where common_fields' differ).
DEFAULTS = dict(hidden_act="relu2", rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128001)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an Arcee HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **fields,
        qkv_bias=bias,
        o_bias=bias,
        activation=activation_name(hf["hidden_act"] or "relu2"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("arcee", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
