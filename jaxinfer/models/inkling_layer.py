"""Inkling's layer leaves, where a checkpoint keeps them, its short convolutions and its sink-routed experts
(models/inkling has the layer itself)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.grouped_matmul import Experts
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.mlp import activation, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.moe import DOWN_AXES, GATE_AXES, ROUTER_AXES, experts_output
from jaxinfer.models.qwen3_5 import fused_experts_hf_leaves
from jaxinfer.models.ssd_chunks import Segments, conv_windows
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

LAYER = "model.layers.{i}."
SHARED_AXES = (None, "embed", "mlp")  # the shared experts' gate and up [S, D, F]: split by hidden units as an MLP's


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class InklingLayer:
    """One layer (D hidden, H heads of K dims, KV key/value heads, R = d_rel, E bias extent, C conv taps): the
    attention's and convs' leaves, then a dense MLP's or the experts' (the other's None)."""

    attn_norm: jax.Array  # [D]
    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    q_norm: jax.Array  # [K]
    k_norm: jax.Array  # [K]
    w_rel: Weight  # [D, H, R] r_proj
    rel_table: jax.Array  # [R, E] rel_logits_proj.proj
    k_conv: jax.Array  # [KV * K, 1, C] float32
    v_conv: jax.Array  # [KV * K, 1, C] float32
    attn_conv: jax.Array  # [D, 1, C] float32
    mlp_conv: jax.Array  # [D, 1, C] float32
    mlp_norm: jax.Array  # [D]
    w_gate: Weight | None = None  # [D, F]
    w_up: Weight | None = None  # [D, F]
    w_down: Weight | None = None  # [F, D]
    mlp_scale: jax.Array | None = None  # [1] float32
    router: jax.Array | None = None  # [D, E + S] float32: the routed experts' logits, then the shared ones'
    router_scale: jax.Array | None = None  # [1] float32
    score_correction: jax.Array | None = None  # [E] float32
    moe_gate: Experts | None = None  # [E, D, F]
    moe_up: Experts | None = None  # [E, D, F]
    moe_down: Experts | None = None  # [E, F, D]
    shared_gate: jax.Array | None = None  # [S, D, F]
    shared_up: jax.Array | None = None  # [S, D, F]
    shared_down: jax.Array | None = None  # [S, F, D]
    embed_norm: jax.Array | None = None  # [D]: layer 0's, the embeddings' RMSNorm

    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_rel": 1, "w_gate": 1, "w_up": 1,
                                             "w_down": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = ()
    EXPERTS: ClassVar[tuple[str, ...]] = ("moe_gate", "moe_up", "moe_down")


def layer_shape(cfg: ModelConfig, layer: int) -> tuple[int, int, int]:
    """(KV heads, head dim, bias extent) of `layer`: the sliding layers' own heads and their window."""
    kv, dims = cfg.kv_shape(layer)
    return kv, dims, cfg.layer_windows[layer] or cfg.inkling.rel_extent


def conv_parts(cfg: ModelConfig, kv_width: int) -> dict[str, slice]:
    """Each conv's channels in the conv state [attn D | mlp D | keys | values], the keys' and values' kv_width
    wide each (the state is as wide as the widest layer's)."""
    D = cfg.hidden_size
    return {"attn": slice(0, D), "mlp": slice(D, 2 * D), "keys": slice(2 * D, 2 * D + kv_width),
            "values": slice(2 * D + kv_width, 2 * D + 2 * kv_width)}


def abstract_layer(cfg: ModelConfig, layer: int) -> InklingLayer:
    """Layer `layer`'s leaves (its kind's heads and bias extent, its MLP's; layer 0 holds the embeddings' norm)."""
    D, H, R, C = cfg.hidden_size, cfg.num_heads, cfg.inkling.d_rel, cfg.state_space.conv_kernel
    KV, K, E = layer_shape(cfg, layer)
    norm = lambda n: ArrayInfo((n,), (None,), init_value=1.0)  # noqa: E731
    conv = lambda n: ArrayInfo((n, 1, C), (None, None, None), init_std=0.3, dtype="float32")  # noqa: E731
    scale = ArrayInfo((1,), (None,), init_value=1.0, dtype="float32")
    leaves: dict[str, Any] = dict(
        attn_norm=norm(D), mlp_norm=norm(D), q_norm=norm(K), k_norm=norm(K),
        wq=ArrayInfo((D, H, K), ("embed", "q_heads", "head_dim")),
        wk=ArrayInfo((D, KV, K), ("embed", "kv_heads", "head_dim")),
        wv=ArrayInfo((D, KV, K), ("embed", "kv_heads", "head_dim")),
        wo=ArrayInfo((H, K, D), ("q_heads", "head_dim", "embed")),
        w_rel=ArrayInfo((D, H, R), ("embed", "q_heads", None)), rel_table=ArrayInfo((R, E), (None, None)),
        k_conv=conv(KV * K), v_conv=conv(KV * K), attn_conv=conv(D), mlp_conv=conv(D),
        embed_norm=norm(D) if layer == 0 else None,
    )
    if not cfg.is_moe_layer(layer):
        return InklingLayer(**leaves, **mlp_leaves(D, cfg.intermediate_size), mlp_scale=scale)
    E_, F, S = cfg.num_experts, cfg.moe_intermediate_size, cfg.inkling.shared_experts
    return InklingLayer(
        **leaves, router=ArrayInfo((D, E_ + S), ROUTER_AXES, dtype="float32"), router_scale=scale,
        score_correction=ArrayInfo((E_,), (None,), init_value=0.0, dtype="float32"),
        moe_gate=ArrayInfo((E_, D, F), GATE_AXES), moe_up=ArrayInfo((E_, D, F), GATE_AXES),
        moe_down=ArrayInfo((E_, F, D), DOWN_AXES), shared_gate=ArrayInfo((S, D, F), SHARED_AXES),
        shared_up=ArrayInfo((S, D, F), SHARED_AXES), shared_down=ArrayInfo((S, F, D), (None, "mlp", "embed")),
    )


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """Where layer `layer`'s leaves live (its kind's shapes; the dense MLP's or the experts' names)."""
    D, H, R, C = cfg.hidden_size, cfg.num_heads, cfg.inkling.d_rel, cfg.state_space.conv_kernel
    KV, K, E = layer_shape(cfg, layer)
    attn, mlp = LAYER + "self_attn.", LAYER + "mlp."
    conv = lambda name, n: HFLeaf(f"{LAYER}{name}.conv1d.weight", "same", (n, 1, C))  # noqa: E731
    leaves = {
        "attn_norm": HFLeaf(LAYER + "input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(LAYER + "post_attention_layernorm.weight", "same", (D,)),
        "q_norm": HFLeaf(attn + "q_norm.weight", "same", (K,)),
        "k_norm": HFLeaf(attn + "k_norm.weight", "same", (K,)),
        "wq": HFLeaf(attn + "q_proj.weight", "in_heads", (H * K, D), H, K),
        "wk": HFLeaf(attn + "k_proj.weight", "in_heads", (KV * K, D), KV, K),
        "wv": HFLeaf(attn + "v_proj.weight", "in_heads", (KV * K, D), KV, K),
        "wo": HFLeaf(attn + "o_proj.weight", "out_heads", (D, H * K), H, K),
        "w_rel": HFLeaf(attn + "r_proj.weight", "in_heads", (H * R, D), H, R),
        "rel_table": HFLeaf(attn + "rel_logits_proj.proj", "same", (R, E)),
        "k_conv": conv("self_attn.k_sconv", KV * K), "v_conv": conv("self_attn.v_sconv", KV * K),
        "attn_conv": conv("attn_sconv", D), "mlp_conv": conv("mlp_sconv", D),
    }
    if not cfg.is_moe_layer(layer):
        return {**leaves, **mlp_hf_leaves(D, cfg.intermediate_size, mlp),
                "mlp_scale": HFLeaf(mlp + "global_scale", "same", (1,))}
    E_, F, S = cfg.num_experts, cfg.moe_intermediate_size, cfg.inkling.shared_experts
    shared = mlp + "shared_experts."
    return {
        **leaves, **fused_experts_hf_leaves(cfg, mlp + "experts."),
        "router": HFLeaf(mlp + "gate.weight", "transpose", (E_ + S, D)),
        "router_scale": HFLeaf(mlp + "gate.global_scale", "same", (1,)),
        "score_correction": HFLeaf(mlp + "gate.e_score_correction_bias", "same", (E_,)),
        "shared_gate": HFLeaf(shared + "gate_proj", "transpose", (S, F, D)),
        "shared_up": HFLeaf(shared + "up_proj", "transpose", (S, F, D)),
        "shared_down": HFLeaf(shared + "down_proj", "transpose", (S, D, F)),
    }


@dataclasses.dataclass(frozen=True)
class Convs:
    """A layer's conv state [S, C-1, channels] (float32) and where a step's flat tokens keep theirs."""

    pool: jax.Array
    slots: jax.Array  # [N] int32
    positions: jax.Array  # [N] int32, -1 padding
    seg: Segments

    def run(self, part: slice, x: jax.Array, weight: jax.Array) -> tuple[jax.Array, "Convs"]:
        """x [N, c] through the causal depthwise conv of weight [c, 1, C] over the `part` channels of the state,
        plus x, in float32 (transformers' InklingShortConvolution), in x's dtype; the state after the step."""
        pool = self.pool[:, :, part][:, :, : x.shape[-1]]
        windows = conv_windows(pool, x.astype(jnp.float32), self.slots, self.positions, self.seg)  # [N, C, c]
        y = jnp.sum(windows * weight[:, 0].T.astype(jnp.float32), axis=-2) + x.astype(jnp.float32)
        target = jnp.where(self.seg.valid, self.slots[self.seg.first], self.pool.shape[0])  # past the segments: none
        start = part.start
        updated = self.pool.at[target, :, start:start + x.shape[-1]].set(windows[self.seg.last, 1:], mode="drop")
        return y.astype(x.dtype), dataclasses.replace(self, pool=updated)


def moe_mlp(h: jax.Array, lw: InklingLayer, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The routed experts plus the shared ones for the normed h [B, T, D], in h's dtype: the top k by float32
    sigmoid score plus the correction bias; their and the shared experts' weights the softmax of their log-sigmoid
    logits, times route_scale and the router's global scale."""
    x2 = h.reshape(-1, h.shape[-1])
    E, k = cfg.num_experts, cfg.experts_per_token
    logits = linear(x2.astype(jnp.float32), lw.router)  # [N, E + S]
    routed, shared = logits[:, :E], logits[:, E:]
    experts = jax.lax.top_k(jax.nn.sigmoid(routed) + lw.score_correction, k)[1]
    picked = jnp.take_along_axis(routed, experts, axis=-1)
    weights = jax.nn.softmax(jax.nn.log_sigmoid(jnp.concatenate([picked, shared], -1)), axis=-1)
    weights = (weights * cfg.routed_scaling_factor * lw.router_scale[0]).astype(h.dtype)
    out = experts_output(x2, weights[:, :k].astype(jnp.float32), experts, lw, layout, cfg.activation)
    return (out.astype(h.dtype) + shared_experts(x2, weights[:, k:], lw, cfg.activation)).reshape(h.shape)


def shared_experts(x: jax.Array, gammas: jax.Array, lw: InklingLayer, act: str) -> jax.Array:
    """Each shared expert's gated MLP of x [N, D], its hidden units times its weight gammas [N, S], summed in
    float32: [N, D] in x's dtype (one expert at a time: `linear`'s products, which XLA:CPU runs in 16 bits too)."""
    total = jnp.zeros(x.shape, jnp.float32)
    for s in range(lw.shared_gate.shape[0]):
        hidden = activation(act, linear(x, lw.shared_gate[s])) * linear(x, lw.shared_up[s])
        total = total + linear(hidden * gammas[:, s:s + 1].astype(hidden.dtype), lw.shared_down[s]).astype(jnp.float32)
    return total.astype(x.dtype)
