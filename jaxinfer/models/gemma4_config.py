"""Gemma 4's config.json read into a ModelConfig (`Gemma4TextConfig`, or its `text_config` run text-only).

Beside Gemma 3's fields: each layer's kv heads and head dim (`per_layer_config`, or transformers' older
`global_head_dim` / `num_global_key_value_heads` for the full-attention layers), which layer's K/V each layer
attends over (`num_kv_shared_layers`: transformers' `kv_sharing_modes`), the per-layer inputs' width
(`hidden_size_per_layer_input`) and the MoE block beside the dense MLP (`enable_moe_block`).
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.layer_type_rope import layer_type_rope
from jaxinfer.config.model import ConfigError, ModelConfig, common_fields, field, layer_types
from jaxinfer.models.llama import gemma_activation

# transformers' Gemma4TextConfig defaults for the fields a config may leave out.
THETAS = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1_000_000.0}}
PER_LAYER_FIELDS = ("head_dim", "num_key_value_heads")


def gemma4_layer_types(hf: Mapping[str, Any], num_layers: int) -> list[str]:
    """`layer_types`, else transformers' default (every 6th layer global); the last layer is always global."""
    types = layer_types(hf, num_layers)
    types = list(types) if types is not None else [
        "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(num_layers)]
    types[-1] = "full_attention"  # transformers forces it (with a warning)
    return types


def kv_sources(types: list[str], shared: int) -> tuple[int, ...]:
    """The layer each layer attends over: itself, or for the last `shared` layers the last earlier layer of the
    same type (transformers' "store" layer; `Gemma4TextConfig.kv_sharing_modes`)."""
    first_shared = len(types) - shared
    if not 0 <= shared < len(types):
        raise ConfigError(f"num_kv_shared_layers {shared} must be between 0 and num_hidden_layers - 1 "
                          f"({len(types) - 1}): at least one layer writes the K/V the others read")
    store = {t: max(i for i in range(first_shared) if types[i] == t) for t in set(types[:first_shared])}
    missing = sorted(set(types[first_shared:]) - set(store))
    if missing:
        raise ConfigError(f"num_kv_shared_layers {shared}: no layer before the shared ones is {missing[0]} "
                          f"(layer_types {types}); each shared layer reads one of its own type")
    return tuple(i if i < first_shared else store[types[i]] for i in range(len(types)))


def kv_shapes(hf: Mapping[str, Any], types: list[str], head_dim: int, kv_heads: int) -> list[tuple[int, int]]:
    """(kv heads, head dim) of each layer: `per_layer_config`'s overrides, else the global layers'
    `global_head_dim` (512) and, under attention_k_eq_v, `num_global_key_value_heads`."""
    overrides = hf.get("per_layer_config")
    if overrides is None:
        full = {"head_dim": int(field(hf, "global_head_dim", 512))}
        if hf.get("attention_k_eq_v") and hf.get("num_global_key_value_heads") is not None:
            full["num_key_value_heads"] = int(hf["num_global_key_value_heads"])
        overrides = {i: full for i, t in enumerate(types) if t == "full_attention"}
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"per_layer_config {overrides!r} must map layer indices to field overrides")
    shapes = [(kv_heads, head_dim)] * len(types)
    for index, fields in overrides.items():
        unknown = sorted(set(fields) - set(PER_LAYER_FIELDS))
        if unknown or not 0 <= int(index) < len(types):
            raise ConfigError(f"per_layer_config[{index!r}] {dict(fields)!r} is not supported: a layer index below "
                              f"{len(types)} overriding only {', '.join(PER_LAYER_FIELDS)}")
        shapes[int(index)] = (int(fields.get("num_key_value_heads", kv_heads)), int(fields.get("head_dim", head_dim)))
    return shapes


def _refuse(hf: Mapping[str, Any], arch: str) -> None:
    """ConfigError naming a setting transformers runs that jaxinfer does not."""
    if hf.get("use_bidirectional_attention") not in (None, "vision"):
        raise ConfigError(f"use_bidirectional_attention={hf['use_bidirectional_attention']!r} is not supported for "
                          f"{arch}; accepted: null, or 'vision' (an image's tokens see each other on the sliding "
                          "layers: models/gemma4_vision; text stays causal)")
    if hf.get("attention_bias"):
        raise ConfigError(f"attention_bias=True is not supported for {arch} (Gemma 4's releases have none)")


def _moe_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The MoE block's sizes (none unless enable_moe_block)."""
    if not hf.get("enable_moe_block"):
        return {}
    sizes = {name: hf.get(name) for name in ("num_experts", "top_k_experts", "moe_intermediate_size")}
    if any(v is None for v in sizes.values()):
        raise ConfigError(f"enable_moe_block=True needs num_experts, top_k_experts and moe_intermediate_size; "
                          f"got {sizes}")
    return dict(num_experts=int(sizes["num_experts"]), experts_per_token=int(sizes["top_k_experts"]),
                moe_intermediate_size=int(sizes["moe_intermediate_size"]), norm_topk_prob=True)


def _per_layer_input_size(hf: Mapping[str, Any], vocab: int) -> int:
    """The per-layer inputs' width (transformers' default 256; 0 or null: none), their vocabulary the model's."""
    size = int(hf.get("hidden_size_per_layer_input", 256) or 0)
    rows = int(field(hf, "vocab_size_per_layer_input", 262_144))
    if size and rows != vocab:
        raise ConfigError(f"vocab_size_per_layer_input {rows} is not supported: jaxinfer reads the per-layer "
                          f"inputs' embedding over the model's vocabulary (vocab_size {vocab})")
    return size


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Gemma 4 text config."""
    _refuse(hf, arch)
    fields = common_fields(hf, arch)
    num_layers, heads = fields["num_layers"], fields["num_heads"]
    types = gemma4_layer_types(hf, num_layers)
    theta, scaling, local_theta = layer_type_rope(
        {**hf, "rope_parameters": hf.get("rope_parameters") or DEFAULT_ROPE}, THETAS, "rope_local_base_freq", arch)
    head_dim = int(field(hf, "head_dim", 256))
    shapes = kv_shapes(hf, types, head_dim, fields["num_kv_heads"])
    if any(heads % kv for kv, _ in shapes):
        raise ConfigError(f"num_attention_heads ({heads}) must be a multiple of every layer's kv heads "
                          f"({[kv for kv, _ in shapes]})")
    window = int(field(hf, "sliding_window", 512))
    sources = kv_sources(types, int(field(hf, "num_kv_shared_layers", 0)))
    wide = 2 if hf.get("use_double_wide_mlp") else 1  # transformers widens the KV-sharing layers' MLPs only
    widths = tuple(fields["intermediate_size"] * (wide if sources[i] != i else 1) for i in range(num_layers))
    cap = field(hf, "final_logit_softcapping")
    return ModelConfig(
        **{**fields, "head_dim": head_dim, "tie_word_embeddings": bool(field(hf, "tie_word_embeddings", True)),
           "max_position_embeddings": int(field(hf, "max_position_embeddings", 131_072)),
           "rope_theta": theta, "rope_scaling": scaling},
        local_rope_theta=local_theta,
        layer_kv_heads=tuple(kv for kv, _ in shapes), layer_head_dims=tuple(k for _, k in shapes),
        kv_sources=sources,
        layer_intermediate_sizes=widths,
        values_from_keys=tuple(i for i, t in enumerate(types)
                               if hf.get("attention_k_eq_v") and t == "full_attention" and sources[i] == i),
        per_layer_input_size=_per_layer_input_size(hf, fields["vocab_size"]),
        pad_token_id=int(field(hf, "pad_token_id", 0)),
        qk_norm=True,
        activation=gemma_activation(hf),
        norm_scale_first=True,
        scale_embeddings=True,
        layer_windows=tuple(window if t == "sliding_attention" else 0 for t in types),
        attn_scale=1.0,
        final_soft_cap=None if cap is None else float(cap),
        **_moe_fields(hf),
    )
