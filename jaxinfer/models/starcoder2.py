"""BigCode's StarCoder2 (Starcoder2ForCausalLM: 3B, 7B, 15B): LayerNorms with biases, biased linears, a GELU MLP.

The pre-norm layer of `models.ungated_mlp` with LayerNorms that add a bias (`cfg.norm_bias`,
epsilon `norm_epsilon`; the final norm too), a bias on every projection under `use_bias` (q/k/v/o
and the MLP's `c_fc` / `c_proj`, `cfg.mlp_bias`) and the ungated MLP c_proj(gelu_tanh(c_fc(x)));
a `sliding_window`, when set, applies to every layer. Fields a config leaves out take transformers'
Starcoder2Config defaults (2 KV heads, biases on, tied head).
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.ungated_mlp import abstract_layer, decoder_layer
from jaxinfer.models.ungated_mlp import hf_leaves as ungated_hf_leaves

ARCHITECTURES = ("Starcoder2ForCausalLM",)
# Starcoder2Config's defaults for fields a config leaves out (where common_fields' differ).
DEFAULTS = dict(hidden_act="gelu_pytorch_tanh", norm_epsilon=1e-5, num_key_value_heads=2, bos_token_id=50256,
                eos_token_id=50256, tie_word_embeddings=True, use_bias=True)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: Llama's names, the MLP's projections `mlp.c_fc` and `mlp.c_proj`."""
    return ungated_hf_leaves(cfg, up="c_fc", down="c_proj")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a StarCoder2 HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    bias = bool(hf["use_bias"])
    return ModelConfig(
        **{**fields, "rms_norm_eps": float(field(hf, "norm_epsilon", 1e-5))},
        layer_norm=True,
        norm_bias=True,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        activation=activation_name(hf["hidden_act"] or "gelu_pytorch_tanh"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], int(field(hf, "sliding_window", 0))),
    )


FAMILY = Family("starcoder2", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
