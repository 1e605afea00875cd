"""Adept's Persimmon (PersimmonForCausalLM: persimmon-8b-base, -chat): GPT-NeoX's sequential layer with q/k LayerNorms.

`models.ungated_mlp`'s layer as GPT-NeoX runs it without `use_parallel_residual`: LayerNorms with biases
(`layer_norm_eps`; the final `final_layernorm` too), q, k and v fused per head in `query_key_value`
([heads, 3, head_dim], biased), the biased output projection `dense` and MLP `dense_h_to_4h` /
`dense_4h_to_h` around relu(x) ** 2 (`hidden_act` relu2). With `qk_layernorm` (on by default) q and k
pass through LayerNorms with one weight and bias over a head's dims that every head shares (Phi's),
before the rotary embedding turns the leading `partial_rotary_factor` (0.5) of each head's dims.
The output head is untied and unbiased.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gpt_neox import hf_leaves as neox_leaves
from jaxinfer.models.phi3 import partial_rotary_dims
from jaxinfer.models.ungated_mlp import UngatedLayerWeights, decoder_layer
from jaxinfer.models.ungated_mlp import abstract_layer as ungated_layer
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("PersimmonForCausalLM",)
# PersimmonConfig's defaults for fields a config leaves out.
DEFAULTS = dict(hidden_act="relu2", layer_norm_eps=1e-5, max_position_embeddings=16384, bos_token_id=1,
                eos_token_id=2, tie_word_embeddings=False, qk_layernorm=True)
LAYER = "model.layers.{i}."


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> UngatedLayerWeights:
    """The ungated layer's leaves, with q/k LayerNorms of one head's dims where `cfg.qk_norm`."""
    if not cfg.qk_norm:
        return ungated_layer(cfg, layer)
    K = cfg.head_dim
    norm, bias = ArrayInfo((K,), ("head_dim",), init_value=1.0), ArrayInfo((K,), ("head_dim",))
    return dataclasses.replace(ungated_layer(cfg, layer), q_norm=norm, k_norm=norm, q_norm_bias=bias, k_norm_bias=bias)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """GPT-NeoX's leaves under `model.layers.{i}.self_attn.`, and the q/k LayerNorms `q_layernorm` / `k_layernorm`."""
    leaves = neox_leaves(cfg, LAYER, "self_attn.")
    if cfg.qk_norm:
        for p in "qk":
            leaves[f"{p}_norm"] = HFLeaf(f"{LAYER}self_attn.{p}_layernorm.weight", "same", (cfg.head_dim,))
            leaves[f"{p}_norm_bias"] = HFLeaf(f"{LAYER}self_attn.{p}_layernorm.bias", "same", (cfg.head_dim,))
    return leaves


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Persimmon HF config (every head its own keys: num_key_value_heads is not read)."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    if fields["hidden_size"] % fields["num_heads"]:
        raise ConfigError(f"hidden_size ({fields['hidden_size']}) must be a multiple of num_attention_heads "
                          f"({fields['num_heads']}) for {arch}")
    head_dim = fields["hidden_size"] // fields["num_heads"]
    return ModelConfig(
        **{**fields, "num_kv_heads": fields["num_heads"], "head_dim": head_dim,
           "rms_norm_eps": float(hf["layer_norm_eps"])},
        layer_norm=True,
        norm_bias=True,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        qk_norm=bool(hf["qk_layernorm"]),
        rotary_dim=partial_rotary_dims(hf, head_dim, 0.5),
        activation=activation_name(hf["hidden_act"] or "relu2"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("persimmon", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=("model.embed_tokens.weight", "model.final_layernorm.weight"))
