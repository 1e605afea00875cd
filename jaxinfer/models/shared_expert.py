"""An MoE layer with a shared expert (Qwen2-MoE, GLM-4.5): routed experts plus one dense MLP every token takes.

Qwen2-MoE scales the shared expert's output per token by sigmoid(x @ shared_expert_gate); GLM-4.5's
is ungated (no `shared_expert_gate`). Either is added to the routed experts' mixed output. Its
projections are a dense MLP's (`embed` x `mlp`, split by tensor parallelism, replicated over expert
parallelism); they are `PROJECTIONS`, so quantization, CPU packing, gate/up joining and LoRA treat
them as they treat a dense layer's MLP. The [D, 1] gate is replicated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.mlp import gated_mlp, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.moe import MoELayerWeights, abstract_moe_layer, moe_block, pre_norm_layer
from jaxinfer.models.rope import RopeTables
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

# Shared-expert field -> the dense MLP field whose leaf description it takes.
AS_DENSE = {"shared_gate": "w_gate", "shared_up": "w_up", "shared_down": "w_down"}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SharedExpertLayerWeights(MoELayerWeights):
    """An MoE layer plus a gated shared expert (its fields default to None only because the parent's do)."""

    shared_gate: Weight | None = None  # [D, S]
    shared_up: Weight | None = None  # [D, S]
    shared_down: Weight | None = None  # [S, D]
    shared_expert_gate: jax.Array | None = None  # [D, 1]; None: ungated (GLM-4.5)

    PROJECTIONS: ClassVar[dict[str, int]] = {**MoELayerWeights.PROJECTIONS, **{name: 1 for name in AS_DENSE}}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (*MoELayerWeights.JOINED, ("shared_gate", "shared_up"))


def abstract_shared_moe_layer(cfg: ModelConfig, gated: bool = True) -> SharedExpertLayerWeights:
    """One MoE layer's leaves with the shared expert's (and its gate where `gated`), as ArrayInfos."""
    routed = abstract_moe_layer(cfg)
    dense = mlp_leaves(cfg.hidden_size, cfg.shared_expert_intermediate_size)
    return SharedExpertLayerWeights(
        **{f.name: getattr(routed, f.name) for f in dataclasses.fields(routed)},
        **{name: dense[field] for name, field in AS_DENSE.items()},
        shared_expert_gate=ArrayInfo((cfg.hidden_size, 1), ("embed", None)) if gated else None,
    )


def shared_expert_hf_leaves(cfg: ModelConfig, prefix: str, module: str = "shared_expert.",
                            gated: bool = True) -> dict[str, HFLeaf]:
    """Where the shared expert lives: "{prefix}{module}{gate,up,down}_proj" and, where `gated`,
    "{prefix}shared_expert_gate"."""
    D = cfg.hidden_size
    dense = mlp_hf_leaves(D, cfg.shared_expert_intermediate_size, prefix + module)
    leaves = {name: dense[field] for name, field in AS_DENSE.items()}
    if gated:
        leaves["shared_expert_gate"] = HFLeaf(prefix + "shared_expert_gate.weight", "transpose", (1, D))
    return leaves


def shared_expert(x: jax.Array, lw: SharedExpertLayerWeights, act: str) -> jax.Array:
    """sigmoid(x @ shared_expert_gate) * mlp(x) for x [B, T, D] (mlp(x) without a gate), in x's dtype.

    The gate's logit is rounded to x's dtype before the sigmoid, as torch's Linear returns it.
    """
    out = gated_mlp(x, lw.shared_gate, lw.shared_up, lw.shared_down, act)
    if lw.shared_expert_gate is None:
        return out
    gate = jax.nn.sigmoid(linear(x, lw.shared_expert_gate).astype(jnp.float32)).astype(x.dtype)
    return gate * out


def shared_moe_decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: SharedExpertLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """One pre-norm block: attention over the cache, then the routed experts plus the gated shared expert."""

    def mlp(h: jax.Array, layout: Layout) -> jax.Array:
        return moe_block(h, lw, cfg, layout) + shared_expert(h, lw, cfg.activation)

    return pre_norm_layer(cfg, x, cache, lw, layer, positions, rope, mlp)
