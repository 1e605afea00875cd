"""LaraMini (`LaraMiniForCausalLM`, Translated's Lara-4-Mini): Qwen3.5's Gated DeltaNet and Qwen3's attention by
`layer_types`, each layer before Flint's MoE block.

As transformers' modeling_lara_mini has it (its modular file names each part's origin):

- `layer_types` lists "linear_attention" (the Gated DeltaNet, models/gated_deltanet, its four projections fused in
  one stored `in_proj`, rows [q | k | v | z | b | a], and its gated norm stored as `out_norm`), "sliding_attention"
  (Qwen3's attention, per-head q/k norms, windowed by `sliding_window`, rotated over the whole head) and
  "full_attention" (the same without rotary embeddings: `cfg.nope_layers`); by default the released period of 5.
- Every layer's MLP is `num_experts_per_tok` of `num_experts` experts chosen by the softmax of float32 router logits
  (renormalised by `norm_topk_prob`) beside a shared expert added in full, without Qwen3-Next's sigmoid gate.
- The RMSNorms are Helium's (w, not Qwen3-Next's 1 + w; scaled in float32 before the cast: `norm_scale_first`); the
  DeltaNet's gated norm takes its weight in float32 too (`StateSpace.strict_gate_norm`).
- No dense MLP anywhere (the config has no `intermediate_size`); transformers saves each layer's experts in two fused
  tensors (`qwen3_5.fused_experts_hf_leaves`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import REQUIRED_FIELDS, ConfigError, ModelConfig, field
from jaxinfer.config.typed_windows import windows_by_type
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gated_deltanet import deltanet_hf_leaves, deltanet_leaves
from jaxinfer.models.hybrid import ATTENTION_FIELDS, hybrid_layer
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.moe import ROUTER_AXES, experts_output, route
from jaxinfer.models.qwen3_5 import MoEDeltaNetLayer, fused_experts_hf_leaves
from jaxinfer.models.qwen3_moe import hf_leaves as qwen3_moe_hf_leaves
from jaxinfer.models.qwen3_next import hybrid_fields, shared_expert_width
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.shared_expert import (
    SharedExpertLayerWeights,
    abstract_shared_moe_layer,
    shared_expert,
    shared_expert_hf_leaves,
)
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("LaraMiniForCausalLM",)
LAYER_TYPES = ("linear_attention", "sliding_attention", "full_attention")
RELEASED_PATTERN = ("linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention")
DELTANET = "model.layers.{i}.linear_attn."
# LaraMiniConfig's defaults for the fields a config may leave out (or null).
DEFAULTS = dict(num_key_value_heads=4, head_dim=128, max_position_embeddings=131072, tie_word_embeddings=True,
                sliding_window=512, linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=128,
                linear_value_head_dim=128, linear_conv_kernel_dim=4, moe_intermediate_size=512,
                shared_expert_intermediate_size=512, num_experts=128, num_experts_per_tok=4, norm_topk_prob=True,
                eos_token_id=151643)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> SharedExpertLayerWeights:
    """Layer `layer`'s leaves: the shared-expert MoE layer's (ungated shared expert, float32 router) with Qwen3's
    attention, or the split DeltaNet's in its place on state layers."""
    moe = abstract_shared_moe_layer(cfg, gated=False)
    moe = dataclasses.replace(moe, router=ArrayInfo((cfg.hidden_size, cfg.num_experts), ROUTER_AXES, dtype="float32"))
    if not cfg.is_state_layer(layer):
        return moe
    kept = {f.name: None if f.name in ATTENTION_FIELDS else getattr(moe, f.name) for f in dataclasses.fields(moe)}
    return MoEDeltaNetLayer(**kept, **deltanet_leaves(cfg.state_space, cfg.hidden_size, split=True))


def fused_deltanet_hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """The DeltaNet's tensors as LaraMini stores them: the four projections as row blocks of one `in_proj`
    [q | k | v | z | b | a], the gated norm under `out_norm`."""
    ss, D = cfg.state_space, cfg.hidden_size
    split = deltanet_hf_leaves(ss, D, DELTANET, split=True)
    widths = {name: split[name].hf_shape[0] for name in ("in_qkv", "in_z", "in_b", "in_a")}
    fused, offset = (DELTANET + "in_proj.weight", "transpose", (sum(widths.values()), D)), 0
    for name, width in widths.items():
        split[name] = HFLeaf(*fused, row_offset=offset)
        offset += width
    split["gate_norm"] = HFLeaf(DELTANET + "out_norm.weight", "same", (ss.head_dim,))
    return split


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Qwen3-MoE's names (norms, router, attention with q/k norms), the fused experts, the ungated shared expert and
    the DeltaNet's tensors."""
    mlp = "model.layers.{i}.mlp."
    return {**qwen3_moe_hf_leaves(cfg), **fused_experts_hf_leaves(cfg, mlp + "experts."),
            **shared_expert_hf_leaves(cfg, mlp, gated=False), **fused_deltanet_hf_leaves(cfg)}


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: SharedExpertLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """The hybrid layer over the routed experts (float32 routing rows, as transformers' float32 router logits) plus
    the shared expert."""

    def mlp(h: jax.Array, layout: Layout) -> jax.Array:
        rows = h.reshape(-1, h.shape[-1])
        weights, experts = route(rows.astype(jnp.float32), lw.router, cfg.experts_per_token, cfg.norm_topk_prob)
        routed = experts_output(rows, weights, experts, lw, layout, cfg.activation).astype(h.dtype)
        return routed.reshape(h.shape) + shared_expert(h, lw, cfg.activation)

    return hybrid_layer(cfg, x, cache, lw, layer, positions, rope, mlp)


def layer_kinds(hf: Mapping[str, Any], num_layers: int, arch: str) -> list[str]:
    """`layer_types`, checked, or the released pattern repeated."""
    kinds = hf.get("layer_types") or [RELEASED_PATTERN[i % len(RELEASED_PATTERN)] for i in range(num_layers)]
    if len(kinds) != num_layers or not set(kinds) <= set(LAYER_TYPES):
        raise ConfigError(f"layer_types {kinds!r} must give one of {list(LAYER_TYPES)} for each of the {num_layers} "
                          f"layers of {arch}")
    return list(kinds)


def check_rotary(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse a partial rotary factor: LaraMini's rotary embedding turns the whole head."""
    factor = (hf.get("rope_parameters") or {}).get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    if factor not in (None, 1, 1.0):
        raise ConfigError(f"partial_rotary_factor {factor!r} is not supported for {arch}: its sliding layers rotate "
                          "the whole head; supported: 1.0 (or unset)")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a LaraMini HF config (LaraMiniConfig's defaults where a key is absent or null)."""
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    check_rotary(hf, arch)
    kinds = layer_kinds(hf, int(hf["num_hidden_layers"]), arch)
    windows = windows_by_type(kinds, int(hf["sliding_window"]), arch)
    experts, per_token = int(hf["num_experts"]), int(hf["num_experts_per_tok"])
    if not 1 <= per_token <= experts:
        raise ConfigError(f"num_experts_per_tok {per_token} must be in [1, num_experts ({experts})] for {arch}")
    linear = ["linear_attention" if kind == "linear_attention" else "full_attention" for kind in kinds]
    experts_width = int(hf["moe_intermediate_size"])
    fields = hybrid_fields({**hf, "intermediate_size": experts_width, "layer_types": linear}, arch)
    fields["state_space"] = dataclasses.replace(fields["state_space"], strict_gate_norm=True)
    return ModelConfig(
        **{**fields, "norm_weight_offset": 0.0, "rotary_dim": 0},
        norm_scale_first=True,
        layer_windows=windows,
        nope_layers=tuple(i for i, kind in enumerate(kinds) if kind == "full_attention"),
        norm_topk_prob=bool(field(hf, "norm_topk_prob", True)),
        shared_expert_intermediate_size=shared_expert_width(hf),
        **moe_fields(hf, "num_experts", experts_width, experts=128, per_token=4),
    )


FAMILY = Family("lara_mini", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                required=tuple(key for key in REQUIRED_FIELDS if key != "intermediate_size"))
