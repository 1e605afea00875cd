"""Mamba-1's selective mixer as pure functions (transformers' MambaMixer): in_proj to x and the gate z -> causal
depthwise conv over x, SiLU -> x_proj to a low-rank dt, B and C (RMS-normed in FalconMamba and Jamba) -> dt_proj,
dt_bias and softplus -> the selective scan, A = -exp(A_log) per (channel, state) -> D skip -> times silu(z) ->
out_proj.

Zamba's mixer splits the channels into G heads (`StateSpace.selective_heads`), each with its own x_proj, dt_proj,
B and C, its in_proj rows alternating x and z (`StateSpace.interleaved_gate`); B and C are [T, G, N] throughout, G 1
for the others.

Unlike Mamba2's per-head scalar decay, every one of the I channels decays each of its N state entries at its own
rate, so a request's SSM state is [I, N] (the pool's [S, I, 1, N]: channels as heads of one dim, config/state_space).
A step's tokens are packed end to end, each request continuing from its row slot's state (cache/state_pool): the
projections and the conv run over all of them at once (the conv through segment-aware windows, models/ssd_chunks),
the recurrence is a `lax.scan` over the flat tokens (models/slot_scan: branchless, zeros at a request's position 0,
padding writes nothing). A decode step is the same over one token per row. On a GPU or TPU a step of at least
`chunk_size` tokens (prefill) runs the chunked form instead (models/selective_chunks: an associative scan within
chunks, a scan across them), picked as Mamba2's mixer picks its chunked SSD (`mamba2_mixer.chunked_form`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxinfer.cache.state_pool import LayerState
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.mamba2_mixer import chunked_form
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.selective_chunks import chunk_tokens, chunked_selective_scan
from jaxinfer.models.slot_scan import slot_scan
from jaxinfer.models.ssd_chunks import Segments, depthwise_conv, segments
from jaxinfer.parallel.array_info import ArrayInfo


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SelectiveWeights:
    """One Mamba-1 mixer's weights (I inner channels, N state entries, R the dt rank, K conv taps)."""

    in_proj: Weight  # [D, 2I]: x, then the gate z (interleaved per channel: Zamba's)
    conv_weight: jax.Array  # [I, 1, K] as HF stores the depthwise Conv1d
    x_proj: Weight  # [I, R + 2N]: dt (low rank), B, C; Zamba's [G, P, R + 2N] per head (I = G P)
    dt_proj: Weight  # [R, I]; Zamba's [G, R, P]
    dt_bias: jax.Array  # [I]; Zamba's [G, P]
    a_log: jax.Array  # [I, N]: A = -exp(a_log); Zamba's [G, P, N]
    d_skip: jax.Array  # [I]; Zamba's [G, P]
    out_proj: Weight  # [I, D]
    conv_bias: jax.Array | None = None  # [I]
    in_bias: jax.Array | None = None  # [2I]
    out_bias: jax.Array | None = None  # [D]
    dt_norm: jax.Array | None = None  # [R]: Jamba's norm weights (FalconMamba's norms have none)
    b_norm: jax.Array | None = None  # [N]
    c_norm: jax.Array | None = None  # [N]

    PROJECTIONS: ClassVar[dict[str, int]] = {"in_proj": 1, "x_proj": 1, "dt_proj": 1, "out_proj": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = ()  # no two projections read the same activations


def _per_channel(ss: StateSpace, *trailing: int, init_value: float | None = None) -> ArrayInfo:
    """A per-channel leaf: [I, ...], or [G, P, ...] with Zamba's heads."""
    G = ss.selective_heads
    shape = ((ss.conv_dim,) if G == 1 else (G, ss.conv_dim // G)) + trailing
    return ArrayInfo(shape, (None,) * len(shape), init_value=init_value)


def selective_leaves(ss: StateSpace, hidden: int, norm_weights: bool = False) -> dict[str, ArrayInfo | None]:
    """The mixer's leaves as ArrayInfos (the `SelectiveWeights` fields); norm_weights: Jamba's dt, B, C norms'."""
    I, N, R, K, G = ss.conv_dim, ss.state_size, ss.time_step_rank, ss.conv_kernel, ss.selective_heads
    return dict(
        in_proj=ArrayInfo((hidden, 2 * I), ("embed", None)),
        conv_weight=ArrayInfo((I, 1, K), (None, None, None), init_std=0.3),
        x_proj=_per_channel(ss, R + 2 * N),
        dt_proj=ArrayInfo((R, I), (None, None)) if G == 1 else ArrayInfo((G, R, I // G), (None, None, None)),
        dt_bias=_per_channel(ss, init_value=0.5),
        a_log=_per_channel(ss, N, init_value=0.0),
        d_skip=_per_channel(ss, init_value=1.0),
        out_proj=ArrayInfo((I, hidden), (None, "embed")),
        conv_bias=ArrayInfo((I,), (None,)) if ss.conv_bias else None,
        in_bias=ArrayInfo((2 * I,), (None,)) if ss.proj_bias else None,
        out_bias=ArrayInfo((hidden,), ("embed",)) if ss.proj_bias else None,
        dt_norm=ArrayInfo((R,), (None,), init_value=1.0) if norm_weights else None,
        b_norm=ArrayInfo((N,), (None,), init_value=1.0) if norm_weights else None,
        c_norm=ArrayInfo((N,), (None,), init_value=1.0) if norm_weights else None,
    )


def selective_hf_leaves(ss: StateSpace, hidden: int, prefix: str, norm_weights: bool = False) -> dict[str, HFLeaf]:
    """Where the mixer's leaves live under `prefix` (e.g. "backbone.layers.{i}.mixer.")."""
    I, N, R, K = ss.conv_dim, ss.state_size, ss.time_step_rank, ss.conv_kernel
    leaves = dict(
        in_proj=HFLeaf(prefix + "in_proj.weight", "transpose", (2 * I, hidden)),
        conv_weight=HFLeaf(prefix + "conv1d.weight", "same", (I, 1, K)),
        x_proj=HFLeaf(prefix + "x_proj.weight", "transpose", (R + 2 * N, I)),
        dt_proj=HFLeaf(prefix + "dt_proj.weight", "transpose", (I, R)),
        dt_bias=HFLeaf(prefix + "dt_proj.bias", "same", (I,)),
        a_log=HFLeaf(prefix + "A_log", "same", (I, N)),
        d_skip=HFLeaf(prefix + "D", "same", (I,)),
        out_proj=HFLeaf(prefix + "out_proj.weight", "transpose", (hidden, I)),
    )
    if ss.selective_heads > 1:  # Zamba's per-head parameters, stored [G, R + 2N, P], [G, P, R], [G, P, ...]
        G = ss.selective_heads
        P = I // G
        leaves |= dict(
            x_proj=HFLeaf(prefix + "x_proj_weight", "transpose", (G, R + 2 * N, P)),
            dt_proj=HFLeaf(prefix + "dt_proj_weight", "transpose", (G, P, R)),
            dt_bias=HFLeaf(prefix + "dt_proj_bias", "same", (G, P)),
            a_log=HFLeaf(prefix + "A_log", "same", (G, P, N)), d_skip=HFLeaf(prefix + "D", "same", (G, P)),
        )
    if ss.conv_bias:
        leaves["conv_bias"] = HFLeaf(prefix + "conv1d.bias", "same", (I,))
    if ss.proj_bias:
        leaves["in_bias"] = HFLeaf(prefix + "in_proj.bias", "same", (2 * I,))
        leaves["out_bias"] = HFLeaf(prefix + "out_proj.bias", "same", (hidden,))
    if norm_weights:
        leaves["dt_norm"] = HFLeaf(prefix + "dt_layernorm.weight", "same", (R,))
        leaves["b_norm"] = HFLeaf(prefix + "b_layernorm.weight", "same", (N,))
        leaves["c_norm"] = HFLeaf(prefix + "c_layernorm.weight", "same", (N,))
    return leaves


def _biased(y: jax.Array, bias: jax.Array | None) -> jax.Array:
    return y if bias is None else y + bias.astype(y.dtype)


def _normed(ss: StateSpace, v: jax.Array, weight: jax.Array | None) -> jax.Array:
    """v RMS-normed where ss.bcdt_norm says (FalconMamba's weightless norm, Jamba's weighted), else as it is."""
    if not ss.bcdt_norm:
        return v
    if weight is not None:
        return rms_norm(v, weight, ss.norm_eps)
    v32 = v.astype(jnp.float32)
    return (v32 * jax.lax.rsqrt(jnp.mean(v32 * v32, axis=-1, keepdims=True) + ss.norm_eps)).astype(v.dtype)


def _low_rank(ss: StateSpace, w: SelectiveWeights, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x_proj over the conv's output x [T, I]: (the low-rank dt [T, G, R], B [T, G, N], C [T, G, N]), x's dtype."""
    R, N, G = ss.time_step_rank, ss.state_size, ss.selective_heads
    if G == 1:
        projected = linear(x, w.x_proj)[:, None]
    else:  # Zamba's per-head x_proj [G, P, R + 2N]
        projected = jnp.einsum("tgp,gpr->tgr", x.reshape(x.shape[0], G, -1), w.x_proj.astype(x.dtype),
                               preferred_element_type=jnp.float32).astype(x.dtype)
    return tuple(jnp.split(projected, [R, R + N], axis=-1))


def selective_inputs(
    ss: StateSpace, w: SelectiveWeights, x: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The conv's output x [T, I] -> (dt [T, I] after dt_proj, dt_bias and softplus, B and C [T, G, N]), float32."""
    low, b, c = _low_rank(ss, w, x)
    low, b, c = _normed(ss, low, w.dt_norm), _normed(ss, b, w.b_norm), _normed(ss, c, w.c_norm)
    if ss.selective_heads == 1:
        dt = linear(low[:, 0], w.dt_proj, out_dtype=jnp.float32)
    else:  # Zamba's per-head dt_proj [G, R, P]
        dt = jnp.einsum("tgr,grp->tgp", low, w.dt_proj.astype(low.dtype), preferred_element_type=jnp.float32)
    dt = dt.reshape(x.shape) + w.dt_bias.reshape(-1).astype(jnp.float32)
    return jax.nn.softplus(dt), b.astype(jnp.float32), c.astype(jnp.float32)


def token_step(
    a: jax.Array, states: tuple[jax.Array], x: jax.Array, dt: jax.Array, b: jax.Array, c: jax.Array
) -> tuple[tuple[jax.Array], jax.Array]:
    """One token of one request: its SSM state [I, 1, N], x and dt [I], B and C [G, N] (each head's P = I / G
    channels reading their own), A [I, N] -> (the state after it, y [I] without the D skip), float32."""
    (G, N), I = b.shape, x.shape[0]
    inputs = ((dt * x).reshape(G, I // G, 1) * b[:, None, :]).reshape(I, N)
    ssm = states[0][:, 0] * jnp.exp(dt[:, None] * a) + inputs
    return (ssm[:, None],), (ssm.reshape(G, I // G, N) @ c[:, :, None]).reshape(I)


def conv(
    w: SelectiveWeights, state: LayerState, x: jax.Array, positions: jax.Array, seg: Segments
) -> tuple[jax.Array, jax.Array]:
    """The causal conv over the flat x [T, I] (each token's window continuing its slot's conv state; seg the step's
    segments), SiLU'd, in float32; and the conv pool with each request's last K - 1 inputs written back."""
    mixed, pool = depthwise_conv(state.conv, w.conv_weight, w.conv_bias, x, state.token_slots, positions, seg)
    return jax.nn.silu(mixed), pool


def packed_scan(
    ss: StateSpace, a: jax.Array, state: LayerState, x: jax.Array, dt: jax.Array, b: jax.Array, c: jax.Array,
    positions: jax.Array, seg: Segments
) -> tuple[jax.Array, jax.Array]:
    """The recurrence token by token (A [I, N]; x, dt [T, I] and B, C [T, G, N] float32, positions [T], -1 padding)
    through each token's slot state: (the SSM pool [S, I, 1, N] after the step, y [T, I] without the D skip)."""
    step = lambda states, *token: token_step(a, states, *token)  # noqa: E731
    (ssm,), y = slot_scan(step, (state.ssm,), state.token_slots, positions, (x, dt, b, c))
    return ssm, y


def packed_chunked(
    ss: StateSpace, a: jax.Array, state: LayerState, x: jax.Array, dt: jax.Array, b: jax.Array, c: jax.Array,
    positions: jax.Array, seg: Segments
) -> tuple[jax.Array, jax.Array]:
    """`packed_scan`'s result in chunks (models/selective_chunks) of `chunk_tokens(ss)`, seg the step's segments."""
    return chunked_selective_scan(x, dt, b, c, a, state.ssm, state.token_slots, positions, seg, chunk_tokens(ss))


def selective_mixer(
    ss: StateSpace, w: SelectiveWeights, h: jax.Array, positions: jax.Array, state: LayerState
) -> tuple[jax.Array, LayerState]:
    """The mixer over normed hidden states h [B, T, D] at positions [B, T] (rows flattened in order, each row's
    tokens in its state's token_slots); returns its output [B, T, D] and the state after them."""
    B, T, D = h.shape
    flat = positions.reshape(-1)
    projected = _biased(linear(h.reshape(B * T, D), w.in_proj), w.in_bias)
    if ss.interleaved_gate:  # Zamba's rows: x and z of channel 0, of channel 1, ...
        x, gate = projected[:, 0::2], projected[:, 1::2]
    else:
        x, gate = jnp.split(projected, 2, axis=-1)
    seg = segments(state.token_slots, flat, min(state.conv.shape[0], flat.shape[0]))
    x, conv_pool = conv(w, state, x, flat, seg)
    dt, b, c = selective_inputs(ss, w, x.astype(h.dtype))
    a = -jnp.exp(w.a_log.astype(jnp.float32)).reshape(x.shape[-1], -1)
    recurrence = packed_chunked if chunked_form(ss, B * T, state.platform) else packed_scan
    ssm, y = recurrence(ss, a, state, x, dt, b, c, flat, seg)
    y = (y + w.d_skip.reshape(-1).astype(jnp.float32) * x) * jax.nn.silu(gate.astype(jnp.float32))
    out = _biased(linear(y.astype(h.dtype), w.out_proj), w.out_bias)
    return out.reshape(B, T, D), dataclasses.replace(state, conv=conv_pool, ssm=ssm)
