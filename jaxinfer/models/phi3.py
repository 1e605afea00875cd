"""The Phi-3 family (Phi-3, Phi-3.5, Phi-4-mini): the Llama layer over fused checkpoint tensors.

The checkpoint stores q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj`; each is read
as its parts at load (row ranges of the fused tensor), so the model runs the shared layer and a
mesh splits each part by its own heads. Rotary embeddings may scale by LongRoPE (`rope_scaling`
with short_factor / long_factor) and turn only part of each head (`partial_rotary_factor`).
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.llama import abstract_layer, decoder_layer

ARCHITECTURES = ("Phi3ForCausalLM",)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: q/k/v and gate/up as row ranges of the fused tensors."""
    H, KV, K, D, F = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    attn, mlp = "model.layers.{i}.self_attn.", "model.layers.{i}.mlp."
    qkv = (attn + "qkv_proj.weight", "in_heads", ((H + 2 * KV) * K, D))
    gate_up = (mlp + "gate_up_proj.weight", "transpose", (2 * F, D))
    return {
        "attn_norm": HFLeaf("model.layers.{i}.input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf("model.layers.{i}.post_attention_layernorm.weight", "same", (D,)),
        "wq": HFLeaf(*qkv, heads=H, head_dim=K),
        "wk": HFLeaf(*qkv, heads=KV, head_dim=K, row_offset=H * K),
        "wv": HFLeaf(*qkv, heads=KV, head_dim=K, row_offset=(H + KV) * K),
        "wo": HFLeaf(attn + "o_proj.weight", "out_heads", (D, H * K), H, K),
        "w_gate": HFLeaf(*gate_up),
        "w_up": HFLeaf(*gate_up, row_offset=F),
        "w_down": HFLeaf(mlp + "down_proj.weight", "transpose", (D, F)),
    }


def partial_rotary_dims(hf: Mapping[str, Any], head_dim: int, default: float = 1.0) -> int:
    """Rotated dims per head from `partial_rotary_factor` (top level, or in rope_parameters; else `default`)."""
    nested = (hf.get("rope_parameters") or {}).get("partial_rotary_factor", default)
    factor = float(field(hf, "partial_rotary_factor", nested))
    dims = int(head_dim * factor)
    if not 0 < factor <= 1 or dims % 2:
        raise ConfigError(f"partial_rotary_factor {factor} must be in (0, 1] and turn an even number of the "
                          f"{head_dim} head dims (it turns {dims})")
    return dims


def check_longrope(cfg: ModelConfig) -> None:
    """LongRoPE needs one short and one long factor per rotated frequency."""
    s = cfg.rope_scaling
    if s.rope_type != "longrope":
        return
    for name in ("short_factor", "long_factor"):
        if len(getattr(s, name)) != cfg.rotated_dims // 2:
            raise ConfigError(f"rope_scaling {name} has {len(getattr(s, name))} entries; LongRoPE needs one per "
                              f"rotated frequency: {cfg.rotated_dims // 2}")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Phi-3 HF config (its sliding_window, when set, applies to every layer)."""
    fields = common_fields(hf, arch, longrope=True)
    if fields["rope_scaling"].rope_type not in ("default", "longrope"):
        raise ConfigError(f"rope type {fields['rope_scaling'].rope_type!r} is not supported for {arch}; "
                          "supported: default, longrope (su)")
    if hf.get("attention_bias"):
        raise ConfigError(f"attention_bias=True is not supported for {arch} (its projections have no biases)")
    cfg = ModelConfig(
        **fields,
        rotary_dim=partial_rotary_dims(hf, fields["head_dim"]),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], int(field(hf, "sliding_window", 0))),
    )
    check_longrope(cfg)
    return cfg


FAMILY = Family("phi3", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
