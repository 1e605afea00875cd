"""Gemma 3n's config.json read into a ModelConfig (`Gemma3nTextConfig`, or its `text_config` run text-only).

Gemma 4's reading where the two agree (KV sharing's store layers, per-layer-type rope, the per-layer inputs'
width), with transformers' Gemma3nTextConfig defaults: every 5th layer global (the last not forced), each layer
its own MLP width (`intermediate_size` a list or one for all) and gate sparsity (`activation_sparsity_pattern`;
null: 0.95 on the first 10 layers of a model deeper than 10), and the AltUp, LAuReL and per-layer vocabulary
fields (`Gemma3nFields`). `altup_coef_clip` clips the coefficients in training only: inference reads them as
stored.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.gemma3n import Gemma3nFields
from jaxinfer.config.layer_type_rope import layer_type_rope
from jaxinfer.config.model import ConfigError, ModelConfig, common_fields, field, layer_types
from jaxinfer.models.gemma4_config import kv_sources
from jaxinfer.models.llama import gemma_activation

# transformers' Gemma3nTextConfig defaults for the fields a config may leave out.
THETAS = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}


def per_layer(hf: Mapping[str, Any], name: str, num_layers: int, default: Any) -> list[Any]:
    """A field holding one value per layer (`intermediate_size`, `activation_sparsity_pattern`), a single value
    standing for every layer's; ConfigError naming it when its length is not the layer count."""
    value = hf.get(name, default)
    values = list(value) if isinstance(value, (list, tuple)) else [value] * num_layers
    if len(values) != num_layers:
        raise ConfigError(f"{name} {value!r} must hold one value for each of the {num_layers} layers, or one for all")
    return values


def sparsity(hf: Mapping[str, Any], num_layers: int) -> tuple[float, ...]:
    """Each layer's activation sparsity: the MLP gate's Gaussian top-k cutoff quantile (0: none)."""
    sparse = 10 if num_layers > 10 else 0  # transformers' default pattern
    default = [0.95] * sparse + [0.0] * (num_layers - sparse)
    given = hf.get("activation_sparsity_pattern") is not None
    values = [float(v) for v in (per_layer(hf, "activation_sparsity_pattern", num_layers, None) if given else default)]
    if any(not 0.0 <= v < 1.0 for v in values):
        raise ConfigError(f"activation_sparsity_pattern {values} is not supported: each layer's is a quantile in "
                          "[0, 1) (0: no cutoff)")
    return tuple(values)


def gemma3n_fields(hf: Mapping[str, Any], vocab: int) -> Gemma3nFields:
    """AltUp's streams, LAuReL's rank and the per-layer inputs' vocabulary, checked."""
    streams, active = int(field(hf, "altup_num_inputs", 4)), int(field(hf, "altup_active_idx", 0))
    if streams < 2 or not 0 <= active < streams:
        raise ConfigError(f"altup_num_inputs {streams} / altup_active_idx {active} are not supported: 2 or more "
                          "streams, the active one among them")
    rows = int(field(hf, "vocab_size_per_layer_input", 262_144))
    if not 0 < rows <= vocab:
        raise ConfigError(f"vocab_size_per_layer_input {rows} must be between 1 and vocab_size ({vocab})")
    return Gemma3nFields(altup_inputs=streams, altup_active=active,
                         altup_correct_scale=bool(field(hf, "altup_correct_scale", True)),
                         laurel_rank=int(field(hf, "laurel_rank", 64)), per_layer_vocab=rows)


def _refuse(hf: Mapping[str, Any], arch: str) -> None:
    """ConfigError naming a setting transformers runs that jaxinfer does not."""
    if hf.get("attention_bias"):
        raise ConfigError(f"attention_bias=True is not supported for {arch} (Gemma 3n's releases have none)")
    if not int(field(hf, "hidden_size_per_layer_input", 256) or 0):
        raise ConfigError(f"hidden_size_per_layer_input {hf.get('hidden_size_per_layer_input')!r} is not supported "
                          f"for {arch}: every Gemma 3n layer reads a per-layer input (a width of 1 or more)")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Gemma 3n text config."""
    _refuse(hf, arch)
    num_layers = int(hf["num_hidden_layers"])
    widths = tuple(int(w) for w in per_layer(hf, "intermediate_size", num_layers, None))
    fields = common_fields({**hf, "intermediate_size": max(widths),
                            "num_key_value_heads": field(hf, "num_key_value_heads", 2)}, arch)
    types = layer_types(hf, num_layers) or [
        "full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(num_layers)]
    theta, scaling, local_theta = layer_type_rope(hf, THETAS, "rope_local_base_freq", arch)
    heads, kv_heads = fields["num_heads"], fields["num_kv_heads"]
    if heads % kv_heads:
        raise ConfigError(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})")
    window = int(field(hf, "sliding_window", 512))
    cap = field(hf, "final_logit_softcapping", 30.0)
    return ModelConfig(
        **{**fields, "head_dim": int(field(hf, "head_dim", 256)),
           "tie_word_embeddings": bool(field(hf, "tie_word_embeddings", True)),
           "max_position_embeddings": int(field(hf, "max_position_embeddings", 32_768)),
           "rope_theta": theta, "rope_scaling": scaling},
        local_rope_theta=local_theta,
        kv_sources=kv_sources(types, int(field(hf, "num_kv_shared_layers", 15))),
        layer_intermediate_sizes=widths,
        layer_sparsity=sparsity(hf, num_layers),
        per_layer_input_size=int(field(hf, "hidden_size_per_layer_input", 256)),
        gemma3n=gemma3n_fields(hf, fields["vocab_size"]),
        pad_token_id=int(field(hf, "pad_token_id", 0)),
        qk_norm=True,
        activation=gemma_activation(hf),
        norm_scale_first=True,
        scale_embeddings=True,
        layer_windows=tuple(window if t == "sliding_attention" else 0 for t in types),
        attn_scale=1.0,
        final_soft_cap=None if cap is None else float(cap),
    )
