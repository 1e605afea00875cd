"""NVIDIA Nemotron-4 and Minitron (NemotronForCausalLM): the Llama layer with LayerNorm1P and a squared-ReLU MLP.

Every norm, the final one too, is a LayerNorm with a bias whose weight is stored less 1
(`cfg.norm_weight_offset`, `cfg.norm_bias`; epsilon `norm_eps`); the MLP is ungated,
down(relu(up(x)) ** 2) (`models.ungated_mlp`); rotary embeddings turn the leading
`partial_rotary_factor` of each head (0.5 unless set, as transformers reads it). Fields a config
leaves out take transformers' NemotronConfig defaults.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family
from jaxinfer.models.glm import rotary_dim
from jaxinfer.models.ungated_mlp import abstract_layer, decoder_layer, hf_leaves

ARCHITECTURES = ("NemotronForCausalLM",)
# NemotronConfig's defaults for fields a config leaves out (where common_fields' differ).
DEFAULTS = dict(hidden_act="relu2", norm_eps=1e-5, bos_token_id=2, eos_token_id=3)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Nemotron HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **{**fields, "rms_norm_eps": float(field(hf, "norm_eps", 1e-5))},
        layer_norm=True,
        norm_bias=True,
        norm_weight_offset=1.0,
        rotary_dim=rotary_dim(hf, fields["head_dim"]),
        qkv_bias=bias,
        o_bias=bias,
        activation=activation_name(hf["hidden_act"] or "relu2"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("nemotron", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
