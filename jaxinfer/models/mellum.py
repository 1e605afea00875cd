"""JetBrains Mellum 2 (MellumForCausalLM: Mellum2-12B-A2.5B): Qwen3-MoE's layer with sliding layers and a rope each.

The layers are Qwen3-MoE's (`qwen3_moe`: per-head q/k RMSNorms, experts routed by softmax and
renormalised under `norm_topk_prob`, on by default), dense where `mlp_layer_types` says "dense"; the
layers `layer_types` marks sliding attend over the last `sliding_window` tokens. Rope parameters come
per layer type, as Laguna's (`rope_parameters.full_attention` / `.sliding_attention`: theta 500000 and
10000 by default; the sliding layers' rope unscaled), each over the whole head: transformers' Mellum
rotates whole heads, so a `partial_rotary_factor` is refused. The
multi-token-prediction layer (`mtp.*`) is not read. Fields a config leaves out take MellumConfig's defaults.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.layer_type_rope import layer_type_rope
from jaxinfer.config.model import LAYER_TYPES, ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.family import Family
from jaxinfer.models.laguna import THETAS
from jaxinfer.models.ministral import typed_windows
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.qwen3_moe import abstract_layer, decoder_layer, hf_leaves

ARCHITECTURES = ("MellumForCausalLM",)
MLP_TYPES = ("dense", "sparse")
# MellumConfig's defaults (Qwen3-MoE's beneath) for fields a config leaves out.
# (The experts' counts: moe_fields' defaults, as a config may name them num_experts or num_local_experts.)
DEFAULTS = dict(intermediate_size=7168, num_key_value_heads=4, head_dim=128, max_position_embeddings=131072,
                sliding_window=1024, moe_intermediate_size=896, norm_topk_prob=True)
DEFAULT_ROPE = {kind: {"rope_type": "default", "rope_theta": theta} for kind, theta in THETAS.items()}


def dense_layers(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """The layers `mlp_layer_types` marks "dense" (by default none)."""
    types = field(hf, "mlp_layer_types", ["sparse"] * num_layers)
    if len(types) != num_layers or not set(types) <= set(MLP_TYPES):
        raise ConfigError(f"mlp_layer_types {types!r} must give each of the {num_layers} layers one of "
                          f"{list(MLP_TYPES)}")
    return tuple(i for i, kind in enumerate(types) if kind == "dense")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Mellum HF config."""
    hf = {**DEFAULTS, **hf, "rope_parameters": field(hf, "rope_parameters", DEFAULT_ROPE)}
    if not set(hf["rope_parameters"]) <= set(LAYER_TYPES):
        raise ConfigError(f"rope_parameters {hf['rope_parameters']!r} is not supported for {arch}: one set per layer "
                          f"type ({', '.join(LAYER_TYPES)}), as MellumConfig writes them")
    for kind, params in hf["rope_parameters"].items():
        if float((params or {}).get("partial_rotary_factor", 1.0)) != 1.0:
            raise ConfigError(f"rope_parameters.{kind}.partial_rotary_factor {params['partial_rotary_factor']} is "
                              f"not supported for {arch}: 1.0 only (transformers' Mellum rotates whole heads)")
    fields = common_fields({k: v for k, v in hf.items() if k != "rope_parameters"}, arch)
    layers = fields["num_layers"]
    theta, scaling, local_theta = layer_type_rope(hf, THETAS, "rope_parameters.sliding_attention", arch)
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **{**fields, "rope_theta": theta, "rope_scaling": scaling},
        local_rope_theta=local_theta,
        layer_windows=typed_windows(hf, arch, layers, ["full_attention"] * layers),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        norm_topk_prob=bool(field(hf, "norm_topk_prob", True)),
        dense_layers=dense_layers(hf, layers),
        **moe_fields(hf, "num_experts", int(field(hf, "moe_intermediate_size", 896)), experts=64, per_token=8),
    )


FAMILY = Family("mellum", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
