"""Inception's Jais 2 (Jais2ForCausalLM: Jais-2-8B-Chat): the Llama layer with biased LayerNorms and a squared-ReLU MLP.

Every norm, the final one too, is a LayerNorm with a bias (`cfg.layer_norm`, `cfg.norm_bias`; epsilon
`layer_norm_eps`); the MLP is ungated, down(relu(up(x)) ** 2) (`models.ungated_mlp`, Nemotron's), its
projections biased under `mlp_bias` (`cfg.mlp_bias`), and q/k/v/o biased under `attention_bias`, both
on by default. Rotary embeddings, attention and checkpoint names are Llama's. Fields a config leaves
out take Jais2Config's defaults.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family
from jaxinfer.models.ungated_mlp import abstract_layer, decoder_layer, hf_leaves

ARCHITECTURES = ("Jais2ForCausalLM",)
# Jais2Config's defaults for fields a config leaves out (where common_fields' differ).
DEFAULTS = dict(hidden_act="relu2", layer_norm_eps=1e-5, attention_bias=True, mlp_bias=True,
                max_position_embeddings=8192, bos_token_id=0, eos_token_id=150024)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Jais 2 HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields({key: value for key, value in hf.items() if key != "mlp_bias"}, arch)  # read here
    attention_bias = bool(hf["attention_bias"])
    return ModelConfig(
        **{**fields, "rms_norm_eps": float(field(hf, "layer_norm_eps", 1e-5))},
        layer_norm=True,
        norm_bias=True,
        mlp_bias=bool(hf["mlp_bias"]),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        activation=activation_name(hf["hidden_act"] or "relu2"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("jais2", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
