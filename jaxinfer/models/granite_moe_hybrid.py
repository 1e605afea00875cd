"""IBM Granite 4.0 hybrids (`GraniteMoeHybridForCausalLM`): Granite-MoE-Shared's layer with a Mamba2 mixer in
place of attention on the layers `layer_types` marks "mamba" (transformers 5: "linear_attention").

Every layer is pre-norm: its mixer (attention or Mamba2, `mamba2_mixer`) then routed experts plus the shared
MLP (`granite_moe.experts_block`), each output scaled by `residual_multiplier` before its residual add, with
Granite's embedding and logit multipliers. Attention layers rotate only with `position_embedding_type`
"rope" (Granite 4.0 ships none: NoPE). The mixer's tensors sit under `model.layers.{i}.mamba.`. The
dense hybrids (`num_local_experts` 0: Granite 4.0-H-Micro, only the shared MLP) run `hybrid`'s dense layer,
the shared MLP as its gated MLP.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, field
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.granite import granite_fields
from jaxinfer.models.granite_moe import SharedMLPLayerWeights, experts_block
from jaxinfer.models.granite_moe import abstract_layer as moe_abstract_layer
from jaxinfer.models.granite_moe import hf_leaves as moe_hf_leaves
from jaxinfer.models.hybrid import (
    ATTENTION_FIELDS,
    MixerFields,
    abstract_dense_layer,
    dense_hybrid_layer,
    hybrid_layer,
    without_attention,
)
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.mamba2 import check_activation, time_step_limit
from jaxinfer.models.mamba2_mixer import MixerWeights, mixer_hf_leaves
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import attention_hf_leaves

ARCHITECTURES = ("GraniteMoeHybridForCausalLM",)
STATE_TYPES, ATTENTION_TYPES = ("mamba", "linear_attention"), ("attention", "full_attention")
SHARED_MLP = "model.layers.{i}.shared_mlp."


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MambaMoELayer(MixerFields, SharedMLPLayerWeights):
    """A Granite MoE layer whose mixer is Mamba2 (its attention fields None)."""


    PROJECTIONS: ClassVar[dict[str, int]] = {
        **{k: v for k, v in SharedMLPLayerWeights.PROJECTIONS.items() if k not in ATTENTION_FIELDS},
        **MixerWeights.PROJECTIONS,
    }
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("shared_gate", "shared_up"),)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> LayerWeights:
    """Layer `layer`'s leaves: Granite-MoE-Shared's (a dense hybrid's: Llama's), with the mixer's in place of
    attention on state layers."""
    if not cfg.num_experts:
        return abstract_dense_layer(cfg, layer)
    moe = moe_abstract_layer(cfg, layer)
    return without_attention(moe, cfg, MambaMoELayer) if cfg.is_state_layer(layer) else moe


def dense_hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """A dense hybrid's MLP: the shared MLP (gate and up as row ranges of its fused `input_linear`)."""
    D, S = cfg.hidden_size, cfg.intermediate_size
    fused = (SHARED_MLP + "input_linear.weight", "transpose", (2 * S, D))
    return {
        "w_gate": HFLeaf(*fused), "w_up": HFLeaf(*fused, row_offset=S),
        "w_down": HFLeaf(SHARED_MLP + "output_linear.weight", "transpose", (D, S)),
    }


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Granite-MoE-Shared's tensors and the mixer's under `model.layers.{i}.mamba.` (each layer reads its own)."""
    mixer_leaves = mixer_hf_leaves(cfg.state_space, cfg.hidden_size, "model.layers.{i}.mamba.")
    if cfg.num_experts:
        return {**moe_hf_leaves(cfg), **mixer_leaves}
    D = cfg.hidden_size
    norms = {"attn_norm": HFLeaf("model.layers.{i}.input_layernorm.weight", "same", (D,)),
             "mlp_norm": HFLeaf("model.layers.{i}.post_attention_layernorm.weight", "same", (D,))}
    return {**norms, **attention_hf_leaves(cfg), **dense_hf_leaves(cfg), **mixer_leaves}


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: LayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """The mixer (Mamba2 or attention), then the experts and shared MLP (a dense hybrid's shared MLP alone),
    each scaled before its residual add."""
    if not cfg.num_experts:
        return dense_hybrid_layer(cfg, x, cache, lw, layer, positions, rope)
    return hybrid_layer(cfg, x, cache, lw, layer, positions, rope, lambda h, layout: experts_block(h, lw, cfg, layout))


def state_layers(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """The layers `layer_types` (or `layers_block_type`) marks Mamba2; transformers' default: all of them."""
    types = field(hf, "layer_types", field(hf, "layers_block_type", ["mamba"] * num_layers))
    if len(types) != num_layers or not set(types) <= set(STATE_TYPES + ATTENTION_TYPES):
        raise ConfigError(f"layer_types {types!r} must list one of {list(STATE_TYPES + ATTENTION_TYPES)} for each "
                          f"of the {num_layers} layers")
    return tuple(i for i, t in enumerate(types) if t in STATE_TYPES)


def state_space(hf: Mapping[str, Any], layers: tuple[int, ...], hidden: int, inner: int | None = None) -> StateSpace:
    """The mixer's dims from the `mamba_*` keys (transformers' defaults where absent); inner: its width where the
    config sets it apart from mamba_expand x hidden_size (Falcon-H1's mamba_d_ssm)."""
    heads = int(field(hf, "mamba_n_heads", 128))
    head_dim = field(hf, "mamba_d_head", "auto")
    width = "mamba_expand x hidden_size" if inner is None else "mamba_d_ssm"
    inner = int(field(hf, "mamba_expand", 2)) * hidden if inner is None else inner
    head_dim = inner // heads if head_dim == "auto" else int(head_dim)
    if heads * head_dim != inner:
        raise ConfigError(f"mamba_n_heads {heads} x mamba_d_head {head_dim} must equal {width} ({inner})")
    groups = int(field(hf, "mamba_n_groups", 1))
    if heads % groups:
        raise ConfigError(f"mamba_n_heads ({heads}) must be a multiple of mamba_n_groups ({groups})")
    return StateSpace(
        layers=layers, num_heads=heads, head_dim=head_dim, state_size=int(field(hf, "mamba_d_state", 256)),
        n_groups=groups, conv_kernel=int(field(hf, "mamba_d_conv", 4)),
        conv_bias=bool(field(hf, "mamba_conv_bias", True)), proj_bias=bool(field(hf, "mamba_proj_bias", False)),
        norm_eps=float(field(hf, "rms_norm_eps", 1e-6)), time_step_limit=time_step_limit(hf),
        chunk_size=int(field(hf, "mamba_chunk_size", 256)),
    )


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a GraniteMoeHybrid HF config."""
    check_activation(hf, "hidden_act", arch)
    rope = field(hf, "position_embedding_type", None)
    if rope not in (None, "nope", "rope"):
        raise ConfigError(f"position_embedding_type {rope!r} is not supported for {arch}; supported: None, 'rope'")
    layers = int(hf["num_hidden_layers"])
    fields = granite_fields({k: v for k, v in hf.items() if k not in ("layer_types", "layers_block_type")}, arch)
    shared = int(field(hf, "shared_intermediate_size", 1024))
    if shared <= 0:
        raise ConfigError(f"shared_intermediate_size {shared} must be > 0 for {arch} (every layer has a shared MLP)")
    experts = int(field(hf, "num_local_experts", 8))
    if experts < 0:
        raise ConfigError(f"num_local_experts {experts} must be >= 0 for {arch} (0: a dense hybrid)")
    # A dense hybrid's one MLP is the shared MLP: it runs as the dense layer's, intermediate_size wide.
    mlp = moe_fields(hf, "num_local_experts", fields["intermediate_size"]) if experts else \
        dict(intermediate_size=shared)
    return ModelConfig(
        **{**fields, **mlp},
        shared_expert_intermediate_size=shared if experts else 0,
        nope_layers=() if rope == "rope" else tuple(range(layers)),
        state_space=state_space(hf, state_layers(hf, layers), fields["hidden_size"]),
    )


FAMILY = Family("granite_moe_hybrid", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
