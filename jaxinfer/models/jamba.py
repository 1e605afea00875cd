"""AI21 Jamba (`JambaForCausalLM`): Mamba-1 layers (models/mamba1_mixer, with weighted RMS norms on dt, B and C) and
attention every `attn_layer_period` layers from `attn_layer_offset`, each followed by routed experts every
`expert_layer_period` layers from `expert_layer_offset` (softmax over `num_experts`, the top `num_experts_per_tok`
weights kept as they are: not renormalised) and by a gated MLP elsewhere, both of `intermediate_size` units.

The attention is Llama's GQA with no positional encoding at all (the Mamba layers order the tokens): no rotary on
any layer. A layer's norms are `input_layernorm` and `pre_ff_layernorm` (`hybrid.hybrid_layer`), its mixer under
`mamba.` or `self_attn.`, its MLP or experts under `feed_forward.`; the final norm is `model.final_layernorm`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.hybrid import ATTENTION_FIELDS, dense_hybrid_layer, hybrid_layer
from jaxinfer.models.layers import Weight
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.llama import abstract_layer as dense_layer
from jaxinfer.models.mamba1_mixer import SelectiveWeights, selective_hf_leaves, selective_leaves
from jaxinfer.models.mamba2 import check_activation
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.mlp import mlp_hf_leaves
from jaxinfer.models.moe import MoELayerWeights, abstract_moe_layer, experts_hf_leaves, is_dense, moe_block
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import attention_hf_leaves

ARCHITECTURES = ("JambaForCausalLM",)
LAYER = "model.layers.{i}."
# JambaConfig's defaults for the fields a config may leave out
HF_DEFAULTS = dict(attn_layer_period=8, attn_layer_offset=4, expert_layer_period=2, expert_layer_offset=1,
                   num_experts=16, num_experts_per_tok=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                   mamba_conv_bias=True, mamba_proj_bias=False, rms_norm_eps=1e-6, max_position_embeddings=262144)


@dataclasses.dataclass
class SelectiveFields:
    """Mamba-1's mixer fields (see mamba1_mixer.SelectiveWeights) a Jamba layer adds after its parent's; None by
    default only because the parent's fields have defaults."""

    in_proj: Weight | None = None
    conv_weight: jax.Array | None = None
    x_proj: Weight | None = None
    dt_proj: Weight | None = None
    dt_bias: jax.Array | None = None
    a_log: jax.Array | None = None
    d_skip: jax.Array | None = None
    out_proj: Weight | None = None
    conv_bias: jax.Array | None = None
    in_bias: jax.Array | None = None
    out_bias: jax.Array | None = None
    dt_norm: jax.Array | None = None
    b_norm: jax.Array | None = None
    c_norm: jax.Array | None = None


def _without_attention(projections: dict[str, int]) -> dict[str, int]:
    return {**{k: v for k, v in projections.items() if k not in ATTENTION_FIELDS}, **SelectiveWeights.PROJECTIONS}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SelectiveDenseLayer(SelectiveFields, LayerWeights):
    """A Mamba layer before a gated MLP (its attention fields None)."""

    PROJECTIONS: ClassVar[dict[str, int]] = _without_attention(LayerWeights.PROJECTIONS)
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("w_gate", "w_up"),)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SelectiveMoELayer(SelectiveFields, MoELayerWeights):
    """A Mamba layer before routed experts (its attention fields None)."""

    PROJECTIONS: ClassVar[dict[str, int]] = _without_attention(MoELayerWeights.PROJECTIONS)
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = ()


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Any:
    """Layer `layer`'s leaves: attention or the Mamba mixer, then the gated MLP or the routed experts."""
    parent = abstract_moe_layer(cfg) if cfg.is_moe_layer(layer) else dense_layer(cfg, layer)
    if not cfg.is_state_layer(layer):
        return parent
    kept = {f.name: getattr(parent, f.name) for f in dataclasses.fields(parent) if f.name not in ATTENTION_FIELDS}
    kind = SelectiveMoELayer if cfg.is_moe_layer(layer) else SelectiveDenseLayer
    return kind(**kept, **{name: None for name in ATTENTION_FIELDS},
                **selective_leaves(cfg.state_space, cfg.hidden_size, norm_weights=True))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives (each layer reads its own mixer's and MLP's)."""
    D, mlp = cfg.hidden_size, LAYER + "feed_forward."
    return {
        "attn_norm": HFLeaf(LAYER + "input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(LAYER + "pre_ff_layernorm.weight", "same", (D,)),
        **attention_hf_leaves(cfg),
        **selective_hf_leaves(cfg.state_space, D, LAYER + "mamba.", norm_weights=True),
        **mlp_hf_leaves(D, cfg.intermediate_size, mlp),
        "router": HFLeaf(mlp + "router.weight", "transpose", (cfg.num_experts, D)),
        **experts_hf_leaves(cfg, mlp + "experts.", ("gate_proj", "up_proj", "down_proj")),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """The mixer (Mamba or attention), then the gated MLP or the routed experts."""
    if is_dense(lw):
        return dense_hybrid_layer(cfg, x, cache, lw, layer, positions, rope)
    return hybrid_layer(cfg, x, cache, lw, layer, positions, rope, lambda h, layout: moe_block(h, lw, cfg, layout))


def periodic(hf: Mapping[str, Any], kind: str, layers: int) -> tuple[int, ...]:
    """The layers i with i % {kind}_layer_period == {kind}_layer_offset, the period and offset checked."""
    period, offset = int(hf[f"{kind}_layer_period"]), int(hf[f"{kind}_layer_offset"])
    if period < 1 or not 0 <= offset < period:
        raise ConfigError(f"{kind}_layer_period {period} and {kind}_layer_offset {offset} are not supported: give "
                          "a period >= 1 and 0 <= offset < period")
    return tuple(i for i in range(layers) if i % period == offset)


def dt_rank(value: Any, hidden: int) -> int:
    """mamba_dt_rank: "auto" (JambaConfig's default) is ceil(hidden_size / 16)."""
    if value == "auto":
        return math.ceil(hidden / 16)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"mamba_dt_rank {value!r} is not supported: give a positive int or 'auto'")
    return value


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Jamba HF config (JambaConfig's defaults where a key is absent or null)."""
    hf = {**HF_DEFAULTS, "mamba_dt_rank": "auto", **{k: v for k, v in hf.items() if v is not None}}
    check_activation(hf, "hidden_act", arch)
    fields = common_fields(hf, arch)
    layers, hidden, eps = fields["num_layers"], fields["hidden_size"], float(hf["rms_norm_eps"])
    attention = periodic(hf, "attn", layers)
    experts = int(field(hf, "num_experts", 16))
    moe = periodic(hf, "expert", layers) if experts > 1 else ()  # one expert: transformers' dense MLP everywhere
    ss = StateSpace.selective(
        tuple(i for i in range(layers) if i not in attention), int(hf["mamba_expand"]) * hidden,
        int(hf["mamba_d_state"]), int(hf["mamba_d_conv"]), dt_rank(hf["mamba_dt_rank"], hidden),
        bool(hf["mamba_conv_bias"]), bool(hf["mamba_proj_bias"]), eps)
    return ModelConfig(
        **{**fields, "rms_norm_eps": eps, "max_position_embeddings": int(hf["max_position_embeddings"])},
        activation=activation_name(field(hf, "hidden_act", "silu")),
        nope_layers=tuple(range(layers)), state_space=ss,
        dense_layers=tuple(i for i in range(layers) if i not in moe),
        norm_topk_prob=False,
        **(moe_fields(hf, "num_experts", fields["intermediate_size"]) if moe else {}),
    )


FAMILY = Family("jamba", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=("model.embed_tokens.weight", "model.final_layernorm.weight"))
