"""Qwen3.5 (`Qwen3_5ForCausalLM`, `Qwen3_5MoeForCausalLM` and the `...ForConditionalGeneration` checkpoints Qwen
ships): Qwen3-Next's hybrid layer (`hybrid.hybrid_layer`: Gated DeltaNet or gated attention by `layer_types`,
zero-centred RMSNorms, a quarter of each head rotated) over a dense gated MLP (Qwen3.5) or Qwen3-Next's routed
experts beside a sigmoid-gated shared expert (Qwen3.5-MoE; its router, Qwen3-VL-MoE's, always renormalises the
top-k probabilities: the config has no `norm_topk_prob`).

What differs from Qwen3-Next is where the weights live. The DeltaNet's input projections are four tensors in plain
head order (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`: gated_deltanet's split leaves). Qwen3.5-MoE's hub
checkpoints keep each layer's experts in two fused tensors, gate_up_proj [E, 2F, D] (gate rows, then up) and
down_proj [E, D, F], where transformers' save_pretrained writes one tensor per expert: the loader reads whichever
the checkpoint stores (`experts_as_stored`).

The conditional-generation checkpoints Qwen ships (`Qwen3_5ForConditionalGeneration`,
`Qwen3_5MoeForConditionalGeneration`) run with images as Qwen3-VL's do (models/qwen2_vl: the text config under
`text_config`, the language model under `model.language_model.`; models/qwen3_vl_vision: the tower, without
DeepStack). Their text rotary is Qwen3-VL's interleaved M-RoPE (`mrope_section`, `mrope_interleaved`) over
`partial_rotary_factor` of each head: each frequency takes the temporal, height or width position. A text token has
the same position on all three axes, so for text it is the plain partial rotary (all Qwen3_5ForCausalLM runs).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Collection, Mapping

import jax

from jaxinfer.config.model import REQUIRED_FIELDS, ModelConfig, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gated_deltanet import deltanet_hf_leaves, deltanet_leaves
from jaxinfer.models.hybrid import ATTENTION_FIELDS, hybrid_layer
from jaxinfer.models.layers import Weight
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.llama import abstract_layer as llama_abstract_layer
from jaxinfer.models.llama import hf_leaves as llama_hf_leaves
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.qwen3_next import abstract_layer as qwen3_next_abstract_layer
from jaxinfer.models.qwen3_next import decoder_layer as moe_layer
from jaxinfer.models.qwen3_next import (
    gated_query_hf_leaves,
    hybrid_fields,
    shared_expert_width,
)
from jaxinfer.models.qwen3_next import hf_leaves as qwen3_next_hf_leaves
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.shared_expert import SharedExpertLayerWeights
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

DENSE_ARCHITECTURES = ("Qwen3_5ForCausalLM",)
PER_EXPERT = "Qwen3_5MoeForCausalLM"  # one tensor per expert, as transformers saves it
# Qwen3_5MoeForConditionalGeneration's language model (models/qwen2_vl): the hub's two fused tensors per layer
FUSED = "Qwen3_5MoeTextForCausalLM"
MOE_ARCHITECTURES = (PER_EXPERT, FUSED)
FUSED_SUFFIX = ".mlp.experts.gate_up_proj"
DELTANET = "model.layers.{i}.linear_attn."
SPLIT_PROJECTIONS = {"in_qkv": 1, "in_z": 1, "in_b": 1, "in_a": 1, "out_proj": 1}


@dataclasses.dataclass
class SplitDeltaNetFields:
    """The Gated DeltaNet's fields with its four input projections apart (see gated_deltanet for their layout),
    added after a parent layer's fields; None by default only because the parents' fields have defaults."""

    in_qkv: Weight | None = None  # [D, 2 * key_heads * key_dim + value_heads * value_dim]
    in_z: Weight | None = None  # [D, value_heads * value_dim]
    in_b: Weight | None = None  # [D, value_heads]
    in_a: Weight | None = None  # [D, value_heads]
    conv_weight: jax.Array | None = None  # [C, 1, K]
    dt_bias: jax.Array | None = None  # [H]
    a_log: jax.Array | None = None  # [H]
    gate_norm: jax.Array | None = None  # [value_dim]
    out_proj: Weight | None = None  # [value_heads * value_dim, D]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DenseAttentionLayer(LayerWeights):
    """Qwen3.5's attention layer: Llama's fields with the attention's output gate."""

    attn_gate: Weight | None = None  # [D, H, K]

    PROJECTIONS: ClassVar[dict[str, int]] = {**LayerWeights.PROJECTIONS, "attn_gate": 1}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DenseDeltaNetLayer(SplitDeltaNetFields, LayerWeights):
    """Qwen3.5's DeltaNet layer: Llama's norms and gated MLP, attention's fields None, the mixer's added."""

    PROJECTIONS: ClassVar[dict[str, int]] = {
        **{k: v for k, v in LayerWeights.PROJECTIONS.items() if k not in ATTENTION_FIELDS}, **SPLIT_PROJECTIONS,
    }
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("w_gate", "w_up"),)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MoEDeltaNetLayer(SplitDeltaNetFields, SharedExpertLayerWeights):
    """Qwen3.5-MoE's DeltaNet layer: the shared-expert MoE layer's fields, attention's None, the mixer's added."""

    PROJECTIONS: ClassVar[dict[str, int]] = {
        **{k: v for k, v in SharedExpertLayerWeights.PROJECTIONS.items() if k not in ATTENTION_FIELDS},
        **SPLIT_PROJECTIONS,
    }
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("shared_gate", "shared_up"),)


def _without_attention(layer: Any) -> dict[str, Any]:
    """`layer`'s leaves by field name, attention's None."""
    return {f.name: None if f.name in ATTENTION_FIELDS else getattr(layer, f.name) for f in dataclasses.fields(layer)}


def abstract_dense_layer(cfg: ModelConfig, layer: int = 0) -> LayerWeights:
    """Layer `layer`'s leaves: Llama's (norms zero-centred) with the output gate, or the split DeltaNet's in place of
    attention on state layers."""
    dense = llama_abstract_layer(cfg, layer)
    if cfg.is_state_layer(layer):
        return DenseDeltaNetLayer(**_without_attention(dense),
                                  **deltanet_leaves(cfg.state_space, cfg.hidden_size, split=True))
    gate = ArrayInfo((cfg.hidden_size, cfg.num_heads, cfg.head_dim), ("embed", "q_heads", "head_dim"))
    return DenseAttentionLayer(**{f.name: getattr(dense, f.name) for f in dataclasses.fields(dense)}, attn_gate=gate)


def abstract_moe_layer(cfg: ModelConfig, layer: int = 0) -> SharedExpertLayerWeights:
    """Qwen3-Next's layer `layer`, its DeltaNet's projections split."""
    moe = qwen3_next_abstract_layer(cfg, layer)
    if not cfg.is_state_layer(layer):
        return moe
    kept = {f.name: getattr(moe, f.name) for f in dataclasses.fields(SharedExpertLayerWeights)}  # attention's None
    return MoEDeltaNetLayer(**kept,
                            **deltanet_leaves(cfg.state_space, cfg.hidden_size, split=True))


def dense_hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Llama's names, q_proj read as the queries and the gate of each head, and the split DeltaNet's tensors."""
    return {**llama_hf_leaves(cfg), **gated_query_hf_leaves(cfg),
            **deltanet_hf_leaves(cfg.state_space, cfg.hidden_size, DELTANET, split=True)}


def moe_hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Qwen3-Next's names with the split DeltaNet's tensors; the hub's fused experts for FUSED."""
    leaves = {**qwen3_next_hf_leaves(cfg), **deltanet_hf_leaves(cfg.state_space, cfg.hidden_size, DELTANET, split=True)}
    if cfg.architecture == FUSED:
        leaves.update(fused_experts_hf_leaves(cfg, "model.layers.{i}.mlp.experts."))
    return leaves


def experts_as_stored(cfg: ModelConfig, names: Collection[str]) -> ModelConfig:
    """`cfg` reading a Qwen3.5-MoE checkpoint's experts as its stored `names` hold them: fused (the hub's) or one
    tensor per expert (transformers' save_pretrained, either class); Qwen4-Exp's (its layers Qwen3.5-MoE's) by
    `Qwen4ExpFields.fused_experts`; any other config unchanged."""
    fused = any(name.endswith(FUSED_SUFFIX) for name in names)
    if cfg.qwen4_exp is not None:
        return dataclasses.replace(cfg, qwen4_exp=dataclasses.replace(cfg.qwen4_exp, fused_experts=fused))
    if cfg.architecture not in MOE_ARCHITECTURES:
        return cfg
    return dataclasses.replace(cfg, architecture=FUSED if fused else PER_EXPERT)


def fused_experts_hf_leaves(cfg: ModelConfig, prefix: str) -> dict[str, HFLeaf]:
    """The experts as two stored tensors in transformers' Linear layout: gate_up_proj [E, 2F, D] (gate rows first)
    and down_proj [E, D, F]."""
    D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    gate_up = (prefix + "gate_up_proj", "transpose", (E, 2 * F, D))
    return {
        "moe_gate": HFLeaf(*gate_up),
        "moe_up": HFLeaf(*gate_up, row_offset=F),
        "moe_down": HFLeaf(prefix + "down_proj", "transpose", (E, D, F)),
    }


def dense_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: LayerWeights, layer: int, positions: jax.Array, rope: RopeTables
) -> tuple[jax.Array, Any]:
    """The hybrid layer over the gated MLP."""

    def mlp(h: jax.Array, layout: Layout) -> jax.Array:
        return gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)

    return hybrid_layer(cfg, x, cache, lw, layer, positions, rope, mlp)


def read_dense_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Qwen3.5 text config (transformers' defaults where a key is absent)."""
    return ModelConfig(**hybrid_fields(hf, arch))


def read_moe_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Qwen3.5-MoE text config: no dense MLP anywhere (the config has no intermediate_size), the
    top-k renormalised."""
    experts_width = int(field(hf, "moe_intermediate_size", 512))
    return ModelConfig(
        **hybrid_fields({"intermediate_size": experts_width, **hf}, arch),
        norm_topk_prob=True,
        shared_expert_intermediate_size=shared_expert_width(hf),
        # transformers' Qwen3_5MoeTextConfig defaults: 256 experts, 8 per token, 512 hidden units each.
        **moe_fields(hf, "num_experts", experts_width, experts=256, per_token=8),
    )


FAMILY = Family("qwen3_5", DENSE_ARCHITECTURES, read_dense_config, abstract_dense_layer, dense_hf_leaves, dense_layer)
MOE_FAMILY = Family("qwen3_5_moe", MOE_ARCHITECTURES, read_moe_config, abstract_moe_layer, moe_hf_leaves, moe_layer,
                    required=tuple(key for key in REQUIRED_FIELDS if key != "intermediate_size"))
