"""Liquid AI LFM3 (`Lfm3ForCausalLM`): LFM2's hybrid (models/lfm2: gated short convs and GQA attention by
`layer_types`, each followed by a SwiGLU, the conv state in the state pool) with what transformers' modeling_lfm3
changes:

- attention layers are "full_attention" or "sliding_attention" (over `sliding_window` tokens); the sliding ones
  rotate with their own default rope (`rope_parameters["sliding_attention"]`), the full ones with the proportional
  rope (Gemma 4's: the leading `partial_rotary_factor` of the frequencies turn, the rest of the dims pass through);
- each head's attention output is scaled by sigmoid(h @ g_proj) (`head_gate` [D, H], one gate per head; stored as
  `self_attn.gate_proj`, the name LFM3's hub checkpoints and transformers' saves give it);
- sandwich norms: the mixer's and the MLP's outputs are RMS-normed (`post_operator_norm`, `post_ffn_norm`) before
  their residual adds (`hybrid.hybrid_layer` reads `post_attn_norm` / `post_mlp_norm`);
- Qwen3's attention names (`o_proj`, `q_norm`, `k_norm`) and the MLP's width as stored (no `block_auto_adjust_ff_dim`).

`use_attention_gate` and `use_sandwich_norm` false and `attention_bias` true are refused by name: LFM3's release has
the gate and the norms, and no biases.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.layer_type_rope import layer_type_rope
from jaxinfer.config.model import ConfigError, ModelConfig, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.hybrid import dense_hybrid_layer
from jaxinfer.models.layers import Weight
from jaxinfer.models.lfm2 import LAYER, ShortConvLayer, lfm2_fields
from jaxinfer.models.lfm2 import abstract_layer as lfm2_layer
from jaxinfer.models.lfm2 import hf_leaves as lfm2_hf_leaves
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.self_attention import attention_hf_leaves
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("Lfm3ForCausalLM",)
LAYER_TYPES = ("conv", "sliding_attention", "full_attention")
# Lfm3Config's defaults for the fields a config may leave out (or null); its layer_types: `default_layer_types`.
HF_DEFAULTS = dict(intermediate_size=7680, head_dim=128, conv_L_cache=7, sliding_window=256, use_sandwich_norm=True,
                   use_attention_gate=True, attention_bias=False, max_position_embeddings=128_000,
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                    "full_attention": {"rope_type": "proportional", "rope_theta": 1_000_000.0,
                                                       "partial_rotary_factor": 0.5}})
THETAS = {"sliding_attention": 10_000.0, "full_attention": 1_000_000.0}  # a layer type's theta where it gives none


@dataclasses.dataclass
class SandwichFields:
    """What an LFM3 layer adds to LFM2's (after its fields in the pytree); None by default only because the
    parent's fields have defaults."""

    post_attn_norm: jax.Array | None = None  # [D]: the mixer's output norm
    post_mlp_norm: jax.Array | None = None  # [D]: the MLP's output norm
    head_gate: Weight | None = None  # [D, H]: attention layers' per-head output gate


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class AttentionLayer(SandwichFields, LayerWeights):
    """An LFM3 attention layer (sliding or full)."""

    PROJECTIONS: ClassVar[dict[str, int]] = {**LayerWeights.PROJECTIONS, "head_gate": 1}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ConvLayer(SandwichFields, ShortConvLayer):
    """An LFM3 short-conv layer (no head gate)."""


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Any:
    """Layer `layer`'s leaves: LFM2's, with the output norms and (attention layers) the head gate."""
    base, D = lfm2_layer(cfg, layer), cfg.hidden_size
    kept = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    norms = {name: ArrayInfo((D,), ("embed",), init_value=1.0) for name in ("post_attn_norm", "post_mlp_norm")}
    if cfg.is_state_layer(layer):
        return ConvLayer(**kept, **norms)
    return AttentionLayer(**kept, **norms, head_gate=ArrayInfo((D, cfg.num_heads), ("embed", "q_heads")))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """LFM2's tensors with Qwen3's attention names, the output norms and the head gate."""
    D = cfg.hidden_size
    return {
        **lfm2_hf_leaves(cfg),
        **attention_hf_leaves(cfg, LAYER + "self_attn."),
        "post_attn_norm": HFLeaf(LAYER + "post_operator_norm.weight", "same", (D,)),
        "post_mlp_norm": HFLeaf(LAYER + "post_ffn_norm.weight", "same", (D,)),
        # transformers' g_proj, stored as gate_proj (its conversion mapping renames it both ways)
        "head_gate": HFLeaf(LAYER + "self_attn.gate_proj.weight", "transpose", (cfg.num_heads, D)),
    }


def default_layer_types(num_layers: int) -> list[str]:
    """Lfm3Config's: every fourth layer from 2 full attention, from 4 sliding, the rest short convs."""
    return ["full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i > 0 else "conv"
            for i in range(num_layers)]


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an LFM3 HF config (Lfm3Config's defaults where a key is absent or null)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    for name, released in (("use_attention_gate", True), ("use_sandwich_norm", True), ("attention_bias", False)):
        if bool(hf[name]) != released:
            raise ConfigError(f"{name} {hf[name]!r} is not supported for {arch}: {str(released).lower()} only (as "
                              "LFM3's released checkpoints have it)")
    layers = int(hf["num_hidden_layers"])
    hf.setdefault("layer_types", default_layer_types(layers))
    if not set(hf["rope_parameters"]) & set(THETAS):
        raise ConfigError(f"rope_parameters {hf['rope_parameters']!r} is not supported for {arch}: give one set per "
                          f"layer type ({', '.join(THETAS)}), as Lfm3Config does")
    theta, scaling, local_theta = layer_type_rope(hf, THETAS, "rope_parameters.sliding_attention", arch)
    window = int(field(hf, "sliding_window"))
    fields = lfm2_fields(hf, arch, int(hf["intermediate_size"]), LAYER_TYPES)
    return ModelConfig(
        **{**fields, "rope_theta": theta, "rope_scaling": scaling},
        local_rope_theta=local_theta,
        layer_windows=tuple(window if t == "sliding_attention" else 0 for t in hf["layer_types"]),
    )


FAMILY = Family("lfm3", ARCHITECTURES, read_config, abstract_layer, hf_leaves, dense_hybrid_layer,
                top_names=("model.embed_tokens.weight", "model.embedding_norm.weight"),
                required=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"))
