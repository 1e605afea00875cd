"""Qwen3-Next (`Qwen3NextForCausalLM`): Gated DeltaNet layers (models/gated_deltanet) and gated attention layers
as `layer_types` lists them ("linear_attention", "full_attention"), each followed by routed experts beside
Qwen2-MoE's sigmoid-gated shared expert (models/shared_expert).

Attention is Qwen3's (per-head q/k RMSNorms, GQA) with partial rotary (`partial_rotary_factor`, 0.25) and an
output gate: q_proj holds each head's query rows, then its gate's, read as two leaves (`wq`, `attn_gate`:
models/self_attention applies the gate before wo). Every RMSNorm but the DeltaNet's gated one is zero-centred
(weight + 1: `norm_weight_offset`). A DeltaNet layer keeps a state per request where attention keeps pages
(cache/state_pool, as the Mamba2 hybrids: prefix caching and speculative decoding are refused); its tensors sit
under `model.layers.{i}.linear_attn.`. The checkpoints' multi-token-prediction module (`mtp.*`) is not read
(checkpoint/hf_names). Dense MLP layers (`mlp_only_layers`, `decoder_sparse_step` > 1) are refused by name: no
released checkpoint has one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gated_deltanet import deltanet_hf_leaves, deltanet_leaves, deltanet_state
from jaxinfer.models.glm import rotary_dim
from jaxinfer.models.hybrid import ATTENTION_FIELDS, hybrid_layer
from jaxinfer.models.layers import Weight
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.moe import moe_block
from jaxinfer.models.qwen2_moe import hf_leaves as qwen2_moe_hf_leaves
from jaxinfer.models.qwen3_moe import dense_mlp_layers
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.shared_expert import SharedExpertLayerWeights, abstract_shared_moe_layer, shared_expert
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("Qwen3NextForCausalLM",)
LAYER_TYPES = ("linear_attention", "full_attention")
PARTIAL_ROTARY_FACTOR = 0.25  # transformers' default for Qwen3-Next


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GatedAttentionLayer(SharedExpertLayerWeights):
    """An attention layer with its output gate (defaulting to None only because the parent's fields do)."""

    attn_gate: Weight | None = None  # [D, H, K]

    PROJECTIONS: ClassVar[dict[str, int]] = {**SharedExpertLayerWeights.PROJECTIONS, "attn_gate": 1}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DeltaNetLayer(SharedExpertLayerWeights):
    """A Gated DeltaNet layer: attention's fields None, the mixer's added (see gated_deltanet for their layout)."""

    in_qkvz: Weight | None = None  # [D, 2 * key_heads * key_dim + 2 * value_heads * value_dim]
    in_ba: Weight | None = None  # [D, 2 * value_heads]
    conv_weight: jax.Array | None = None  # [C, 1, K]
    dt_bias: jax.Array | None = None  # [H]
    a_log: jax.Array | None = None  # [H]
    gate_norm: jax.Array | None = None  # [value_dim]
    out_proj: Weight | None = None  # [value_heads * value_dim, D]

    PROJECTIONS: ClassVar[dict[str, int]] = {
        **{k: v for k, v in SharedExpertLayerWeights.PROJECTIONS.items() if k not in ATTENTION_FIELDS},
        "in_qkvz": 1, "in_ba": 1, "out_proj": 1,
    }
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("shared_gate", "shared_up"),)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> SharedExpertLayerWeights:
    """Layer `layer`'s leaves: the shared-expert MoE layer's, its norms zero-centred, with the attention's output
    gate, or the DeltaNet's fields in place of attention on state layers."""
    moe = abstract_shared_moe_layer(cfg)
    D = cfg.hidden_size
    leaves = {f.name: getattr(moe, f.name) for f in dataclasses.fields(moe)}
    leaves.update(attn_norm=ArrayInfo((D,), ("embed",), init_value=0.0),
                  mlp_norm=ArrayInfo((D,), ("embed",), init_value=0.0))
    if cfg.is_state_layer(layer):
        leaves.update({name: None for name in ATTENTION_FIELDS})
        return DeltaNetLayer(**leaves, **deltanet_leaves(cfg.state_space, D))
    gate = ArrayInfo((D, cfg.num_heads, cfg.head_dim), ("embed", "q_heads", "head_dim"))
    return GatedAttentionLayer(**leaves, attn_gate=gate)


def gated_query_hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """q_proj read as the queries and the output gate of each head (each head's query rows, then its gate's)."""
    D, H, K = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    q_proj = ("model.layers.{i}.self_attn.q_proj.weight", "in_head_rows", (2 * H * K, D), H, K)
    return {"wq": HFLeaf(*q_proj), "attn_gate": HFLeaf(*q_proj, row_offset=K)}


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Qwen2-MoE's names, q_proj read as the queries and the gate of each head, and the DeltaNet's tensors."""
    return {
        **qwen2_moe_hf_leaves(cfg),
        **gated_query_hf_leaves(cfg),
        **deltanet_hf_leaves(cfg.state_space, cfg.hidden_size, "model.layers.{i}.linear_attn."),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: SharedExpertLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """The hybrid layer over the routed experts plus the shared expert."""

    def mlp(h: jax.Array, layout: Layout) -> jax.Array:
        return moe_block(h, lw, cfg, layout) + shared_expert(h, lw, cfg.activation)

    return hybrid_layer(cfg, x, cache, lw, layer, positions, rope, mlp)


def linear_layers(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """The layers `layer_types` marks linear_attention; without it, all but every full_attention_interval-th."""
    interval = int(field(hf, "full_attention_interval", 4))
    default = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    types = field(hf, "layer_types", default)
    if len(types) != num_layers or not set(types) <= set(LAYER_TYPES):
        raise ConfigError(f"layer_types {types!r} must list one of {list(LAYER_TYPES)} for each of the "
                          f"{num_layers} layers")
    return tuple(i for i, t in enumerate(types) if t == "linear_attention")


def check_supported(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse by name what no released Qwen3-Next or Qwen3.5 checkpoint uses: attention biases, a conv activation
    other than SiLU."""
    if hf.get("attention_bias"):
        raise ConfigError(f"attention_bias=True is not supported for {arch}; supported: False")
    act = field(hf, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"hidden_act {act!r} is not supported for {arch} (its DeltaNet conv runs it); "
                          "supported: 'silu'")


def hybrid_fields(hf: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """The ModelConfig fields Qwen3-Next and Qwen3.5 read alike (transformers' defaults where a key is absent): the
    common ones, the DeltaNet's state, q/k norms, zero-centred norms, partial rotary."""
    check_supported(hf, arch)
    fields = common_fields(hf, arch)
    state = deltanet_state(
        linear_layers(hf, fields["num_layers"]), key_heads=int(field(hf, "linear_num_key_heads", 16)),
        key_dim=int(field(hf, "linear_key_head_dim", 128)), value_heads=int(field(hf, "linear_num_value_heads", 32)),
        value_dim=int(field(hf, "linear_value_head_dim", 128)), conv_kernel=int(field(hf, "linear_conv_kernel_dim", 4)),
        eps=fields["rms_norm_eps"],
    )
    return dict(
        **fields,
        qk_norm=True,
        norm_weight_offset=1.0,
        rotary_dim=rotary_dim({"partial_rotary_factor": PARTIAL_ROTARY_FACTOR, **hf}, fields["head_dim"]),
        activation=activation_name(field(hf, "hidden_act", "silu")),
        state_space=state,
    )


def shared_expert_width(hf: Mapping[str, Any]) -> int:
    """shared_expert_intermediate_size (transformers' default 512), checked: every MoE layer has a shared expert."""
    shared = int(field(hf, "shared_expert_intermediate_size", 512))
    if shared < 1:
        raise ConfigError(f"shared_expert_intermediate_size {shared} must be >= 1 (each layer has a shared expert)")
    return shared


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Qwen3-Next HF config; dense MLP layers are refused by name (no released checkpoint has one:
    every layer must route through experts)."""
    layers = int(hf["num_hidden_layers"])
    dense = dense_mlp_layers(hf, layers)
    if dense or int(field(hf, "num_experts", 512)) < 1:
        raise ConfigError(f"dense MLP layers {list(dense)} (mlp_only_layers {field(hf, 'mlp_only_layers', [])!r}, "
                          f"decoder_sparse_step {field(hf, 'decoder_sparse_step', 1)!r}, num_experts "
                          f"{field(hf, 'num_experts', 512)!r}) are not supported for {arch}: every layer must route "
                          "through experts (mlp_only_layers [], decoder_sparse_step 1, num_experts >= 1)")
    return ModelConfig(
        **hybrid_fields(hf, arch),
        norm_topk_prob=bool(field(hf, "norm_topk_prob", True)),
        shared_expert_intermediate_size=shared_expert_width(hf),
        # transformers' Qwen3NextConfig defaults: 512 experts, 10 per token, 512 hidden units each.
        **moe_fields(hf, "num_experts", int(field(hf, "moe_intermediate_size", 512)), experts=512, per_token=10),
    )


FAMILY = Family("qwen3_next", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
