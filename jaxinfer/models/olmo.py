"""OLMo 1 (OlmoForCausalLM: AI2's OLMo-1B/7B-hf, OLMo-1.7): the Llama layer with weightless LayerNorms.

Every norm (the two in each layer and the final one) is a LayerNorm with neither weight nor bias
and an epsilon of 1e-5 that transformers fixes (`cfg.weightless_norms`: the layers' `attn_norm` and
`mlp_norm` are None, the decoder has no `final_norm` leaf). q, k and v are clamped to
[-clip_qkv, clip_qkv] after their projection where the config sets it (`cfg.clip_qkv`, DBRX's);
heads are hidden_size / num_attention_heads wide. Fields a config leaves out take OlmoConfig's defaults.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.llama import LayerWeights, decoder_layer
from jaxinfer.models.mlp import mlp_hf_leaves, mlp_leaves
from jaxinfer.models.self_attention import attention_hf_leaves, attention_leaves

ARCHITECTURES = ("OlmoForCausalLM",)
NORM_EPS = 1e-5  # OlmoLayerNorm's, not a config field
# OlmoConfig's defaults for fields a config leaves out (where common_fields' differ).
DEFAULTS = dict(max_position_embeddings=2048, eos_token_id=50279)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> LayerWeights:
    """One layer's leaves as ArrayInfos: Llama's projections, no norm weights."""
    return LayerWeights(attn_norm=None, mlp_norm=None, **attention_leaves(cfg),
                        **mlp_leaves(cfg.hidden_size, cfg.intermediate_size))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in an HF checkpoint: Llama's names, without the norms."""
    return {**attention_hf_leaves(cfg), **mlp_hf_leaves(cfg.hidden_size, cfg.intermediate_size)}


def _clip_qkv(hf: Mapping[str, Any]) -> float | None:
    clip = field(hf, "clip_qkv")
    if clip is not None and float(clip) <= 0:
        raise ConfigError(f"clip_qkv {clip} must be positive or null (no clamp of q, k and v)")
    return None if clip is None else float(clip)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an OLMo 1 HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **{**fields, "rms_norm_eps": NORM_EPS},
        layer_norm=True,
        weightless_norms=True,
        clip_qkv=_clip_qkv(hf),
        qkv_bias=bias,
        o_bias=bias,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("olmo", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
