"""IBM Granite MoE (GraniteMoeForCausalLM: Granite 3.0 1b-a400m / 3b-a800m, PowerMoE) and GraniteMoeShared:
Granite's multipliers (`models.granite`) over a layer whose MLP is routed experts.

The router keeps the top k of its logits and softmaxes them among themselves (as GPT-OSS's, without a
bias). The checkpoint stores each layer's experts fused: `input_linear` [E, 2F, D] holds every expert's
gate rows then its up rows, `output_linear` [E, D, F] its down projection; both are split and transposed
at load. GraniteMoeShared adds a dense gated MLP every token takes (`shared_mlp`, its gate and up fused
the same way in one [2S, D] tensor), added to the experts' output before the residual multiplier; with
`shared_intermediate_size` 0 (transformers' default) it has none and is GraniteMoe.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gpt_oss import route_top_logits
from jaxinfer.models.granite import granite_fields, scaled_residual_layer
from jaxinfer.models.layers import Weight
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.mlp import gated_mlp, mlp_leaves
from jaxinfer.models.moe import MoELayerWeights, abstract_moe_layer, experts_output
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import attention_hf_leaves
from jaxinfer.models.shared_expert import AS_DENSE
from jaxinfer.parallel.sharding import Layout

GRANITE_MOE, GRANITE_MOE_SHARED = "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM"
ARCHITECTURES = (GRANITE_MOE, GRANITE_MOE_SHARED)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SharedMLPLayerWeights(MoELayerWeights):
    """A Granite MoE layer plus the shared MLP (its fields default to None only because the parent's do)."""

    shared_gate: Weight | None = None  # [D, S]
    shared_up: Weight | None = None  # [D, S]
    shared_down: Weight | None = None  # [S, D]

    # A dense MLP's projections: tp splits, quantization, CPU packing, joining and LoRA treat them so.
    PROJECTIONS: ClassVar[dict[str, int]] = {**MoELayerWeights.PROJECTIONS, **{name: 1 for name in AS_DENSE}}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (*MoELayerWeights.JOINED, ("shared_gate", "shared_up"))


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> MoELayerWeights:
    """One layer's leaves as ArrayInfos: the routed experts, and the shared MLP where the config has one."""
    routed = abstract_moe_layer(cfg)
    if not cfg.shared_expert_intermediate_size:
        return routed
    dense = mlp_leaves(cfg.hidden_size, cfg.shared_expert_intermediate_size)
    return SharedMLPLayerWeights(**{f.name: getattr(routed, f.name) for f in dataclasses.fields(routed)},
                                 **{name: dense[leaf] for name, leaf in AS_DENSE.items()})


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: gate and up as row ranges of the fused `input_linear` tensors."""
    D, E, F, S = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    layer, moe = "model.layers.{i}.", "model.layers.{i}.block_sparse_moe."
    experts = (moe + "input_linear.weight", "transpose", (E, 2 * F, D))
    leaves = {
        "attn_norm": HFLeaf(layer + "input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(layer + "post_attention_layernorm.weight", "same", (D,)),
        "router": HFLeaf(moe + "router.layer.weight", "transpose", (E, D)),
        "moe_gate": HFLeaf(*experts),
        "moe_up": HFLeaf(*experts, row_offset=F),
        "moe_down": HFLeaf(moe + "output_linear.weight", "transpose", (E, D, F)),
        **attention_hf_leaves(cfg),
    }
    if S:
        shared = (layer + "shared_mlp.input_linear.weight", "transpose", (2 * S, D))
        leaves.update(shared_gate=HFLeaf(*shared), shared_up=HFLeaf(*shared, row_offset=S),
                      shared_down=HFLeaf(layer + "shared_mlp.output_linear.weight", "transpose", (D, S)))
    return leaves


def experts_block(x: jax.Array, lw: MoELayerWeights, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The routed experts' output for x [B, T, D] (plus the shared MLP's, where the layer has one), x's dtype."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    weights, experts = route_top_logits(x2, lw.router, None, cfg.experts_per_token)
    out = experts_output(x2, weights, experts, lw, layout, cfg.activation).astype(x.dtype).reshape(shape)
    if isinstance(lw, SharedMLPLayerWeights):
        out = out + gated_mlp(x, lw.shared_gate, lw.shared_up, lw.shared_down, cfg.activation)
    return out


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: MoELayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """Attention, then the experts, each scaled by the residual multiplier before its residual add."""
    return scaled_residual_layer(cfg, x, cache, lw, layer, positions, rope,
                                 lambda h, layout: experts_block(h, lw, cfg, layout))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a GraniteMoe or GraniteMoeShared HF config (transformers' defaults: 8 experts, 2 per
    token, each intermediate_size wide; no shared MLP)."""
    fields = granite_fields(hf, arch)
    shared = int(field(hf, "shared_intermediate_size", 0)) if arch == GRANITE_MOE_SHARED else 0
    if shared < 0:
        raise ConfigError(f"shared_intermediate_size {shared} must be >= 0 (0: no shared MLP)")
    return ModelConfig(
        **fields,
        shared_expert_intermediate_size=shared,
        **moe_fields(hf, "num_local_experts", fields["intermediate_size"]),
    )


FAMILY = Family("granite_moe", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
