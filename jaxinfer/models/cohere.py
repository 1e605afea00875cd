"""Cohere's Command R and R+, Aya 23 (CohereForCausalLM): Cohere 2's parallel layer in every layer, all with rope.

One bias-free LayerNorm feeds attention and the gated MLP, both added to the residual stream at
once (`models.cohere2`'s layer and weights); q and k rotate in adjacent pairs of dims
(`cfg.rope_interleaved`) in every layer, with no sliding window; with `use_qk_norm` (Command R+)
q and k pass through per-head LayerNorms holding a weight per head and dim (`self_attention.qk_norm`).
The logits are multiplied by `logit_scale`. Fields a config leaves out take transformers' CohereConfig
defaults (theta 500000, tied head).
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.cohere2 import abstract_layer, decoder_layer, hf_leaves
from jaxinfer.models.family import Family

ARCHITECTURES = ("CohereForCausalLM",)
# CohereConfig's defaults for fields a config leaves out.
DEFAULTS = dict(logit_scale=0.0625, max_position_embeddings=8192, layer_norm_eps=1e-5, bos_token_id=5,
                eos_token_id=255001, tie_word_embeddings=True, rope_theta=500000.0)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Command R / R+ HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    scale = hf["logit_scale"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
        raise ConfigError(f"logit_scale {scale!r} is not supported for {arch}: a number > 0")
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **{**fields, "rms_norm_eps": float(hf["layer_norm_eps"])},
        layer_norm=True,
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=bool(hf.get("use_qk_norm", False)),
        rope_interleaved=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        logits_scaling=1.0 / float(scale),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("cohere", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
