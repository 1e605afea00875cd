"""Kimi Delta Attention (KDA: Kimi Linear's linear-attention layers) as pure functions: q, k and v projections -> a
causal depthwise conv over (q, k, v) with SiLU -> the gated delta rule with a decay per key channel -> RMSNorm
gated by sigmoid -> o_proj.

It is Gated DeltaNet (models/gated_deltanet) but for three things. H heads of K dims serve q, k and v alike (no
q/k head shared by several value heads). The forget gate is per key channel: g = -exp(A_log_h) * softplus(f_b(f_a
(x)) + dt_bias) in R^{H x K} (f_a a rank-K bottleneck), the softplus taken as its input past 20 as transformers
and FLA do (so exp never overflows to inf and no difference of two infinite log decays turns into NaN). The output
is RMS-normed per head in float32 and times sigmoid(g_b(g_a(x))). The state, its pools, the per-token scan and the
chunked form are the DeltaNet's: `deltanet_state` with as many q/k heads as value heads, `token_step` and
`delta_chunks` taking the per-channel decay. transformers stores the conv per input (q_conv1d, k_conv1d,
v_conv1d) and A_log as [1, 1, H, 1]; both are read as stored. The Ling hybrid (models/bailing_hybrid) projects each
gate in one full-rank step (f_proj, g_proj: `ONE_PROJECTION`), A_log [H], and bounds the log decay below:
kda_lower_bound * sigmoid(exp(A_log) (f + dt_bias)) (`StateSpace.decay_lower_bound`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.cache.state_pool import LayerState
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.gated_deltanet import deltanet_state, gated_rms_norm, packed_chunked, packed_scan
from jaxinfer.models.layers import linear, linears
from jaxinfer.models.mamba2_mixer import chunked_form
from jaxinfer.parallel.array_info import ArrayInfo

SOFTPLUS_BOUND = 20.0  # transformers' (and FLA's) forget gate: softplus(x) taken as x past it
INPUTS = ("q", "k", "v")  # the conv's inputs, in its channel order
# Every projection of the layer's normed input: one matrix product where joined (models/joined_weight)
INPUT_PROJECTIONS = ("in_q", "in_k", "in_v", "f_a", "in_b", "g_a")
# The same with the forget and output gates one full-rank projection each (the Ling hybrid's f_proj, g_proj)
ONE_PROJECTION = ("in_q", "in_k", "in_v", "f_proj", "in_b", "g_proj")


def kda_state(layers: tuple[int, ...], heads: int, head_dim: int, conv_kernel: int, eps: float) -> StateSpace:
    """The KDA layers' state as the DeltaNet's: H heads of K dims for q, k and v (C = 3 H K conv channels)."""
    state = deltanet_state(layers, key_heads=heads, key_dim=head_dim, value_heads=heads, value_dim=head_dim,
                           conv_kernel=conv_kernel, eps=eps)
    return dataclasses.replace(state, key_decay=True)


def one_projection_leaves(ss: StateSpace, hidden: int) -> dict[str, ArrayInfo]:
    """The Ling hybrid's mixer: KDA's leaves with each gate one [D, H K] projection, A_log [H]."""
    leaves = {k: v for k, v in kda_leaves(ss, hidden).items() if k not in ("f_a", "f_b", "g_a", "g_b", "a_log")}
    return dict(**leaves, f_proj=ArrayInfo((hidden, ss.inner), ("embed", None)),
                g_proj=ArrayInfo((hidden, ss.inner), ("embed", None)),
                a_log=ArrayInfo((ss.num_heads,), (None,), init_value=0.0, dtype="float32"))


def kda_leaves(ss: StateSpace, hidden: int) -> dict[str, ArrayInfo]:
    """The mixer's leaves as ArrayInfos (H heads of K dims: W = H K)."""
    H, K, W = ss.num_heads, ss.head_dim, ss.inner
    return dict(
        **{f"in_{x}": ArrayInfo((hidden, W), ("embed", None)) for x in INPUTS},
        **{f"conv_{x}": ArrayInfo((W, 1, ss.conv_kernel), (None, None, None), init_std=0.3) for x in INPUTS},
        f_a=ArrayInfo((hidden, K), ("embed", None)),
        f_b=ArrayInfo((K, W), (None, None)),
        dt_bias=ArrayInfo((W,), (None,), init_value=1.0, dtype="float32"),
        a_log=ArrayInfo((1, 1, H, 1), (None, None, None, None), init_value=0.0, dtype="float32"),
        in_b=ArrayInfo((hidden, H), ("embed", None)),
        g_a=ArrayInfo((hidden, K), ("embed", None)),
        g_b=ArrayInfo((K, W), (None, None)),
        gate_norm=ArrayInfo((K,), (None,), init_value=1.0),
        out_proj=ArrayInfo((W, hidden), (None, "embed")),
    )


def kda_hf_leaves(ss: StateSpace, hidden: int, prefix: str) -> dict[str, HFLeaf]:
    """Where the mixer's leaves live under `prefix` (Kimi Linear's "model.layers.{i}.self_attn.")."""
    H, K, W = ss.num_heads, ss.head_dim, ss.inner
    return dict(
        **{f"in_{x}": HFLeaf(f"{prefix}{x}_proj.weight", "transpose", (W, hidden)) for x in INPUTS},
        **{f"conv_{x}": HFLeaf(f"{prefix}{x}_conv1d.weight", "same", (W, 1, ss.conv_kernel)) for x in INPUTS},
        f_a=HFLeaf(prefix + "f_a_proj.weight", "transpose", (K, hidden)),
        f_b=HFLeaf(prefix + "f_b_proj.weight", "transpose", (W, K)),
        dt_bias=HFLeaf(prefix + "dt_bias", "same", (W,)),
        a_log=HFLeaf(prefix + "A_log", "same", (1, 1, H, 1)),
        in_b=HFLeaf(prefix + "b_proj.weight", "transpose", (H, hidden)),
        g_a=HFLeaf(prefix + "g_a_proj.weight", "transpose", (K, hidden)),
        g_b=HFLeaf(prefix + "g_b_proj.weight", "transpose", (W, K)),
        gate_norm=HFLeaf(prefix + "o_norm.weight", "same", (K,)),
        out_proj=HFLeaf(prefix + "o_proj.weight", "transpose", (hidden, W)),
    )


def forget_gate(ss: StateSpace, w: Any, f: jax.Array) -> jax.Array:
    """The forget gate's input [N, H K] (f_b's output, or f_proj's) -> the log decay per head and key channel
    [N, H, K], float32 (<= 0): -exp(A_log) softplus(f + dt_bias), or under a `decay_lower_bound` (the Ling
    hybrid's kda_safe_gate) bound * sigmoid(exp(A_log) (f + dt_bias))."""
    a = (f.astype(jnp.float32) + w.dt_bias.astype(jnp.float32)).reshape(f.shape[0], ss.num_heads, ss.head_dim)
    rate = jnp.exp(w.a_log.astype(jnp.float32)).reshape(ss.num_heads, 1)
    if ss.decay_lower_bound:
        return ss.decay_lower_bound * jax.nn.sigmoid(rate * a)
    return -rate * jnp.where(a > SOFTPLUS_BOUND, a, jnp.log(1.0 + jnp.exp(a)))


def kda(ss: StateSpace, w: Any, h: jax.Array, positions: jax.Array, state: LayerState) -> tuple[jax.Array, LayerState]:
    """The mixer over normed hidden states h [B, T, D] at positions [B, T] (rows flattened in order, each row's
    tokens in its state's token_slots); returns its output [B, T, D] and the state after them."""
    B, T, D = h.shape
    x = h.reshape(B * T, D)
    low_rank = getattr(w, "f_b", None) is not None  # Kimi's gates through a rank-K bottleneck; the Ling hybrid's not
    q, k, v, f, b, g = linears(x, [getattr(w, name) for name in (INPUT_PROJECTIONS if low_rank else ONE_PROJECTION)])
    if low_rank:
        f, g = linear(f, w.f_b), linear(g, w.g_b)
    qkv = jnp.concatenate([q, k, v], axis=-1)
    conv_weight = jnp.concatenate([getattr(w, f"conv_{n}") for n in INPUTS])
    beta = jax.nn.sigmoid(b).astype(jnp.float32)
    recurrence = packed_chunked if chunked_form(ss, B * T, state.platform) else packed_scan
    state, y = recurrence(ss, conv_weight, state, qkv.astype(jnp.float32), forget_gate(ss, w, f), beta,
                          positions.reshape(-1))
    gate = g.reshape(B * T, ss.num_heads, ss.head_dim)
    normed = gated_rms_norm(y.astype(h.dtype), gate, w.gate_norm, ss.norm_eps, jax.nn.sigmoid, strict_fp32=True)
    out = linear(normed.reshape(B * T, ss.inner), w.out_proj)
    return out.reshape(B, T, D), state
