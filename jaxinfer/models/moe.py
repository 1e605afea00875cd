"""Mixture-of-experts layers (Mixtral, Qwen3-MoE): top-k routing and experts over sorted rows.

Routing is softmax over the router's logits, then the top k (renormalised where the model
says so). Each token's k copies are sorted by expert and go through their experts only
(`grouped_matmul.expert_mlp`); the outputs are put back in token order and mixed by the
routing weights. On a mesh the block runs under `shard_map`: each device holds its experts
(the `experts` axis over ep) and its slice of each expert's hidden units (`mlp` over tp),
computes every routed row that falls to its experts, and one psum over ep and tp adds the
partial outputs: tokens stay where they are (replicated over ep), so no all-to-all is needed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.grouped_matmul import Experts, RowBiases, expert_mlp
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.mlp import Gate
from jaxinfer.models.norms import config_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, attention_leaves, self_attention
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout, shard_map
from jaxinfer.quantization.quantized_experts import experts_spec

GATE_AXES = ("experts", "embed", "mlp")  # moe_gate, moe_up [E, D, F]
DOWN_AXES = ("experts", "mlp", "embed")  # moe_down [E, F, D]
ROUTER_AXES = ("embed", None)  # router [D, E]: every device routes every token


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MoELayerWeights:
    """One decoder layer whose MLP is routed experts."""

    attn_norm: jax.Array  # [D]
    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    mlp_norm: jax.Array  # [D]
    router: jax.Array  # [D, E]
    moe_gate: Experts  # [E, D, F]
    moe_up: Experts  # [E, D, F]
    moe_down: Experts  # [E, F, D]
    bq: jax.Array | None = None  # [H, K]
    bk: jax.Array | None = None  # [KV, K]
    bv: jax.Array | None = None  # [KV, K]
    bo: jax.Array | None = None  # [D]
    q_norm: jax.Array | None = None  # [K]
    k_norm: jax.Array | None = None  # [K]
    attn_norm_bias: jax.Array | None = None  # [D]: Phi-3.5-MoE's LayerNorms (cfg.norm_bias)
    mlp_norm_bias: jax.Array | None = None  # [D]

    # The attention projections; the experts keep their own layout (see grouped_matmul).
    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv": 1, "wo": 2}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wq", "wk", "wv"),)
    EXPERTS: ClassVar[tuple[str, ...]] = ("moe_gate", "moe_up", "moe_down")


def abstract_moe_layer(cfg: ModelConfig) -> MoELayerWeights:
    """One MoE layer's leaves as ArrayInfos."""
    D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    norm_bias = ArrayInfo((D,), ("embed",)) if cfg.norm_bias else None
    return MoELayerWeights(
        attn_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
        attn_norm_bias=norm_bias,
        mlp_norm_bias=norm_bias,
        mlp_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
        router=ArrayInfo((D, E), ROUTER_AXES),
        moe_gate=ArrayInfo((E, D, F), GATE_AXES),
        moe_up=ArrayInfo((E, D, F), GATE_AXES),
        moe_down=ArrayInfo((E, F, D), DOWN_AXES),
        **attention_leaves(cfg),
    )


def experts_hf_leaves(cfg: ModelConfig, prefix: str, names: tuple[str, str, str]) -> dict[str, HFLeaf]:
    """Per-expert gate, up and down Linear tensors ("{prefix}{e}.{name}.weight"), each stacked on experts."""
    D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    gate, up, down = (f"{prefix}{{e}}.{name}.weight" for name in names)
    return {
        "moe_gate": HFLeaf(gate, "transpose", (F, D), experts=E),
        "moe_up": HFLeaf(up, "transpose", (F, D), experts=E),
        "moe_down": HFLeaf(down, "transpose", (D, F), experts=E),
    }


def route(x: jax.Array, router: jax.Array, k: int, renormalise: bool) -> tuple[jax.Array, jax.Array]:
    """Routing weights [N, k] (float32) and expert ids [N, k] of rows x [N, D]: softmax, then top k."""
    probs = jax.nn.softmax(linear(x, router).astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, k)
    if renormalise:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts


def routed_experts(
    x: jax.Array,  # [N, D]
    weights: jax.Array,  # [N, k] f32
    experts: jax.Array,  # [N, k] int32 global expert ids
    gate: Experts,  # [E_local, D, F_local]
    up: Experts,
    down: Experts,  # [E_local, F_local, D]
    first: jax.Array | int,  # global id of the first local expert
    act: Gate,
    implementation: str = "auto",  # see grouped_matmul.expert_mlp
    biases: tuple[jax.Array, jax.Array] | None = None,  # local experts' gate and up biases [E_local, F_local]
) -> jax.Array:
    """The mixed output [N, D] (float32) of the routed rows that fall to the local experts (others add 0)."""
    rows, k = experts.shape
    local_count = gate.shape[0]
    local = experts.reshape(-1) - first
    # Rows of other devices' experts sort last, past every local group: they stay zero.
    key = jnp.where((local >= 0) & (local < local_count), local, local_count)
    order = jnp.argsort(key, stable=True)
    sizes = jnp.bincount(key, length=local_count + 1)[:local_count].astype(jnp.int32)
    row_biases = None if biases is None else _row_biases(biases, key[order], x.dtype)
    out_sorted = expert_mlp(x[order // k], gate, up, down, sizes, act, implementation, row_biases)
    out = jnp.zeros_like(out_sorted).at[order].set(out_sorted).reshape(rows, k, -1)
    return jnp.einsum("nkd,nk->nd", out.astype(jnp.float32), weights)


def _row_biases(biases: tuple[jax.Array, jax.Array], sorted_local: jax.Array, dtype: jnp.dtype) -> RowBiases:
    """Each sorted row's expert's gate and up biases [N, F]; rows of other devices' experts get zeros."""
    take = lambda b: jnp.take(b, sorted_local, axis=0, mode="fill", fill_value=0).astype(dtype)  # noqa: E731
    return take(biases[0]), take(biases[1])


def moe_block(x: jax.Array, lw: MoELayerWeights, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The routed experts' output for x [B, T, D] in x's dtype."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    weights, experts = route(x2, lw.router, cfg.experts_per_token, cfg.norm_topk_prob)
    return experts_output(x2, weights, experts, lw, layout, cfg.activation).astype(x.dtype).reshape(shape)


def experts_output(
    x2: jax.Array, weights: jax.Array, experts: jax.Array, lw: Any, layout: Layout, act: Gate,
    biases: tuple[jax.Array, jax.Array] | None = None,
) -> jax.Array:
    """`routed_experts` of rows x2 [N, D] over the layer's experts (`moe_gate`, `moe_up`, `moe_down`), on
    one device or on each device of the mesh over its experts and hidden units, partial sums added: [N, D] f32.

    biases: the experts' gate and up biases [E, F], sharded as the experts' hidden units are.
    """
    if layout.mesh is None:
        return routed_experts(x2, weights, experts, lw.moe_gate, lw.moe_up, lw.moe_down, 0, act, biases=biases)
    gate_spec = layout.spec(lw.moe_gate.shape, GATE_AXES)
    gate_specs, up_specs, down_specs = (experts_spec(getattr(lw, name), axes, layout, name) for name, axes in
                                        (("moe_gate", GATE_AXES), ("moe_up", GATE_AXES), ("moe_down", DOWN_AXES)))
    row_spec = layout.spec(x2.shape, ("tokens", None))
    rows_only = PartitionSpec(row_spec[0], None)
    expert_axis, hidden_axis = gate_spec[0], gate_spec[2]
    summed = tuple(axis for axis in (expert_axis, hidden_axis) if axis is not None)
    local_count = lw.moe_gate.shape[0] // layout.axis_size(expert_axis) if expert_axis else lw.moe_gate.shape[0]

    def shard(x_part, w_part, e_part, gate, up, down, *bias_parts):
        first = jax.lax.axis_index(expert_axis) * local_count if expert_axis else 0
        out = routed_experts(x_part, w_part, e_part, gate, up, down, first, act, biases=bias_parts or None)
        return jax.lax.psum(out, summed) if summed else out

    bias_spec = PartitionSpec(expert_axis, hidden_axis)
    in_specs = (row_spec, rows_only, rows_only, gate_specs, up_specs, down_specs) + (bias_spec,) * len(biases or ())
    operands = (x2, weights, experts, lw.moe_gate, lw.moe_up, lw.moe_down, *(biases or ()))
    return shard_map(shard, layout, in_specs, rows_only)(*operands)


def pre_norm_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
    mlp: Callable[[jax.Array, Layout], jax.Array],
) -> tuple[jax.Array, Any]:
    """One pre-norm block: attention over the cache, then mlp(normed residual, layout), each added to the residual.
    The norms are RMSNorms, or LayerNorms (`cfg.layer_norm`) with the layer's biases where it has them."""
    layout = cache.layout
    h = config_norm(x, lw.attn_norm, getattr(lw, "attn_norm_bias", None), cfg)
    out, cache = self_attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(x + out, HIDDEN)
    h = config_norm(x, lw.mlp_norm, getattr(lw, "mlp_norm_bias", None), cfg)
    return layout.constrain(x + mlp(h, layout), HIDDEN), cache


def moe_decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: MoELayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """One pre-norm block: attention over the cache, then the routed experts."""
    return pre_norm_layer(cfg, x, cache, lw, layer, positions, rope, lambda h, layout: moe_block(h, lw, cfg, layout))


def is_dense(lw: Any) -> bool:
    """Whether a layer of an MoE model runs a dense MLP (Qwen3-MoE's `mlp_only_layers`)."""
    return isinstance(lw, LayerWeights)
