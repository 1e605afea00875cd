"""The Mamba2 mixer as pure functions: in_proj -> causal depthwise conv over (x, B, C) -> the SSD
recurrence (per-head scalar decay A, dt through softplus with dt_bias, D skip) -> gated RMSNorm -> out_proj.
Falcon-H1's variants are config (`StateSpace`): in_proj's parts scaled by its ssm_multipliers, and the gate met
with the norm after it or with no norm at all.

A step's tokens are packed end to end (several requests, each continuing from its row slot's state:
cache/state_pool). The projections and the norm run over all of them at once; the recurrence is a
`lax.scan` over the flat tokens (models/slot_scan), each reading and writing its own slot's conv and SSM state (a state
starts from zeros at a request's position 0; padding tokens write nothing). A decode step is the
same scan over one token per row. On a GPU or TPU a step of at least `chunk_size` tokens (prefill) runs the
chunked SSD instead (models/ssd_chunks: matmuls within chunks, segment-aware across requests), which gives the
scan's outputs and states with the matmul units doing the work rather than T sequential tiny steps.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.cache.state_pool import LayerState
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.slot_scan import slot_scan
from jaxinfer.models.ssd_chunks import chunked_ssd, conv_windows, segments
from jaxinfer.parallel.array_info import ArrayInfo


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MixerWeights:
    """One Mamba2 mixer's weights (C = conv channels, H heads, I = H * head_dim)."""

    in_proj: Weight  # [D, I + C + H]: the gate z, the conv's channels (x, B, C), dt
    conv_weight: jax.Array  # [C, 1, K] as HF stores the depthwise Conv1d
    dt_bias: jax.Array  # [H]
    a_log: jax.Array  # [H]: A = -exp(a_log)
    d_skip: jax.Array  # [H]
    gate_norm: jax.Array | None  # [I]; None where the gate meets y with no norm (Falcon-H1's mamba_rms_norm off)
    out_proj: Weight  # [I, D]
    conv_bias: jax.Array | None = None  # [C]
    in_bias: jax.Array | None = None  # [I + C + H]
    out_bias: jax.Array | None = None  # [D]

    PROJECTIONS: ClassVar[dict[str, int]] = {"in_proj": 1, "out_proj": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = ()  # no two projections read the same activations


def mixer_leaves(ss: StateSpace, hidden: int) -> dict[str, ArrayInfo | None]:
    """The mixer's leaves as ArrayInfos (the `MixerWeights` fields)."""
    H, C = ss.num_heads, ss.conv_dim
    return dict(
        in_proj=ArrayInfo((hidden, ss.projected), ("embed", None)),
        conv_weight=ArrayInfo((C, 1, ss.conv_kernel), (None, None, None), init_std=0.3),
        dt_bias=ArrayInfo((H,), (None,), init_value=0.5),
        a_log=ArrayInfo((H,), (None,), init_value=0.0),
        d_skip=ArrayInfo((H,), (None,), init_value=1.0),
        gate_norm=None if ss.gate == "gate" else ArrayInfo((ss.inner,), (None,), init_value=1.0),
        out_proj=ArrayInfo((ss.inner, hidden), (None, "embed")),
        conv_bias=ArrayInfo((C,), (None,)) if ss.conv_bias else None,
        in_bias=ArrayInfo((ss.projected,), (None,)) if ss.proj_bias else None,
        out_bias=ArrayInfo((hidden,), ("embed",)) if ss.proj_bias else None,
    )


def mixer_hf_leaves(ss: StateSpace, hidden: int, prefix: str) -> dict[str, HFLeaf]:
    """Where the mixer's leaves live under `prefix` (e.g. "backbone.layers.{i}.mixer.")."""
    H, C = ss.num_heads, ss.conv_dim
    leaves = dict(
        in_proj=HFLeaf(prefix + "in_proj.weight", "transpose", (ss.projected, hidden)),
        conv_weight=HFLeaf(prefix + "conv1d.weight", "same", (C, 1, ss.conv_kernel)),
        dt_bias=HFLeaf(prefix + "dt_bias", "same", (H,)),
        a_log=HFLeaf(prefix + "A_log", "same", (H,)),
        d_skip=HFLeaf(prefix + "D", "same", (H,)),
        out_proj=HFLeaf(prefix + "out_proj.weight", "transpose", (hidden, ss.inner)),
    )
    if ss.gate != "gate":
        leaves["gate_norm"] = HFLeaf(prefix + "norm.weight", "same", (ss.inner,))
    if ss.conv_bias:
        leaves["conv_bias"] = HFLeaf(prefix + "conv1d.bias", "same", (C,))
    if ss.proj_bias:
        leaves["in_bias"] = HFLeaf(prefix + "in_proj.bias", "same", (ss.projected,))
        leaves["out_bias"] = HFLeaf(prefix + "out_proj.bias", "same", (hidden,))
    return leaves


def _biased(y: jax.Array, bias: jax.Array | None) -> jax.Array:
    return y if bias is None else y + bias.astype(y.dtype)


def conv_mix(ss: StateSpace, w: MixerWeights, window: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Conv windows [..., K, C] -> SiLU'd x [..., H, P], B and C [..., G, N], in float32."""
    mixed = jnp.sum(window * w.conv_weight[:, 0].T.astype(jnp.float32), axis=-2)  # K products per channel
    mixed = jax.nn.silu(_biased(mixed, None if w.conv_bias is None else w.conv_bias.astype(jnp.float32)))
    x, b, c = jnp.split(mixed, [ss.inner, ss.inner + ss.n_groups * ss.state_size], axis=-1)
    lead = mixed.shape[:-1]
    groups = (*lead, ss.n_groups, ss.state_size)
    return x.reshape(*lead, ss.num_heads, ss.head_dim), b.reshape(groups), c.reshape(groups)


def time_steps(ss: StateSpace, w: MixerWeights, dt: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw dt [..., H] -> (dt after softplus and clamp, A [H] = -exp(a_log)), in float32."""
    dt = jnp.clip(jax.nn.softplus(dt + w.dt_bias.astype(jnp.float32)), *ss.time_step_limit)
    return dt, -jnp.exp(w.a_log.astype(jnp.float32))


def token_step(
    ss: StateSpace, w: MixerWeights, conv: jax.Array, ssm: jax.Array, xbc: jax.Array, dt: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One token of one request: (conv state [K-1, C], SSM state [H, P, N]) and its conv input xbc [C] and raw
    dt [H] -> (new conv state, new SSM state, y [H, P]), in float32."""
    repeats = ss.num_heads // ss.n_groups
    window = jnp.concatenate([conv, xbc[None]], axis=0)  # [K, C]
    x, b, c = conv_mix(ss, w, window)
    b = jnp.repeat(b, repeats, axis=0)  # [H, N]: each group's B shared by its heads
    c = jnp.repeat(c, repeats, axis=0)
    dt, a = time_steps(ss, w, dt)
    decay = jnp.exp(dt * a)  # [H]
    ssm = ssm * decay[:, None, None] + (dt[:, None] * x)[:, :, None] * b[:, None, :]
    y = jnp.einsum("hpn,hn->hp", ssm, c) + w.d_skip.astype(jnp.float32)[:, None] * x
    return window[1:], ssm, y


def packed_scan(
    ss: StateSpace, w: MixerWeights, state: LayerState, xbc: jax.Array, dt: jax.Array, positions: jax.Array
) -> tuple[LayerState, jax.Array]:
    """The recurrence over T flat tokens (xbc [T, C], dt [T, H], positions [T], -1 padding), each through its
    slot's state (zeros at position 0); returns the pools after them and y [T, H, P] float32."""

    def step(states: tuple[jax.Array, jax.Array], xbc_t: jax.Array, dt_t: jax.Array):
        conv, ssm, y = token_step(ss, w, *states, xbc_t, dt_t)
        return (conv, ssm), y

    inputs = (xbc.astype(jnp.float32), dt.astype(jnp.float32))
    (conv, ssm), y = slot_scan(step, (state.conv, state.ssm), state.token_slots, positions, inputs)
    return dataclasses.replace(state, conv=conv, ssm=ssm), y


def packed_chunked(
    ss: StateSpace, w: MixerWeights, state: LayerState, xbc: jax.Array, dt: jax.Array, positions: jax.Array
) -> tuple[LayerState, jax.Array]:
    """`packed_scan`'s result through the chunked SSD (models/ssd_chunks) in chunks of ss.chunk_size."""
    slots, num_slots = state.token_slots, state.conv.shape[0]
    seg = segments(slots, positions, min(num_slots, positions.shape[0]))
    windows = conv_windows(state.conv, xbc.astype(jnp.float32), slots, positions, seg)  # [T, K, C]
    x, b, c = conv_mix(ss, w, windows)
    dt, a = time_steps(ss, w, dt.astype(jnp.float32))
    y, final = chunked_ssd(x, b, c, dt, a, state.ssm, slots, positions, seg, ss.chunk_size)
    y = y + w.d_skip.astype(jnp.float32)[:, None] * x
    target = jnp.where(seg.valid, slots[seg.first], num_slots)  # past the segments: dropped
    conv = state.conv.at[target].set(windows[seg.last, 1:], mode="drop")
    ssm = state.ssm.at[target].set(final, mode="drop")
    return dataclasses.replace(state, conv=conv, ssm=ssm), y


def chunked_form(ss: StateSpace, tokens: int, platform: str) -> bool:
    """Whether a step of `tokens` flat tokens runs the chunked SSD (static: by its shape and platform): from
    chunk_size tokens on, on an accelerator; a CPU ran the scan faster at every size measured (docs/benchmarks.md)."""
    return tokens >= ss.chunk_size and platform != "cpu"


def grouped_rms_norm(h: jax.Array, weight: jax.Array, groups: int, eps: float) -> jax.Array:
    """h [T, I] RMS-normed within each of `groups` groups, times weight (float32 math)."""
    h = h.astype(jnp.float32)
    grouped = h.reshape(*h.shape[:-1], groups, -1)
    grouped = grouped * jax.lax.rsqrt(jnp.mean(grouped * grouped, axis=-1, keepdims=True) + eps)
    return weight.astype(jnp.float32) * grouped.reshape(h.shape)


def gated_output(ss: StateSpace, y: jax.Array, gate: jax.Array, weight: jax.Array | None) -> jax.Array:
    """y [T, I] met with silu(gate) as ss.gate says (transformers' MambaRMSNormGated, norm_before_gate False:
    "norm_gated"; Falcon-H1's with it True: "norm_then_gate"; no norm: "gate"), in float32."""
    gated = jax.nn.silu(gate.astype(jnp.float32))
    if ss.gate == "norm_then_gate":
        return grouped_rms_norm(y, weight, ss.n_groups, ss.norm_eps) * gated
    h = y.astype(jnp.float32) * gated
    return h if ss.gate == "gate" else grouped_rms_norm(h, weight, ss.n_groups, ss.norm_eps)


def proj_scales(ss: StateSpace) -> np.ndarray | None:
    """in_proj's per-output scale [I + C + H] by ss.proj_multipliers (z, x, B, C, dt); None when all are 1."""
    if ss.proj_multipliers == (1.0,) * 5:
        return None
    GN = ss.n_groups * ss.state_size
    widths = (ss.inner, ss.inner, GN, GN, ss.num_heads)
    return np.concatenate([np.full(n, m, np.float32) for n, m in zip(widths, ss.proj_multipliers)])


def mixer(
    ss: StateSpace, w: MixerWeights, h: jax.Array, positions: jax.Array, state: LayerState
) -> tuple[jax.Array, LayerState]:
    """The mixer over normed hidden states h [B, T, D] at positions [B, T] (rows flattened in order, each row's
    tokens in its state's token_slots); returns its output [B, T, D] and the state after them."""
    B, T, D = h.shape
    projected = _biased(linear(h.reshape(B * T, D), w.in_proj), w.in_bias)
    scales = proj_scales(ss)
    projected = projected if scales is None else projected * scales.astype(projected.dtype)
    gate, xbc, dt = jnp.split(projected, [ss.inner, ss.inner + ss.conv_dim], axis=-1)
    recurrence = packed_chunked if chunked_form(ss, B * T, state.platform) else packed_scan
    state, y = recurrence(ss, w, state, xbc, dt, positions.reshape(-1))
    normed = gated_output(ss, y.reshape(B * T, ss.inner), gate, w.gate_norm)
    out = _biased(linear(normed.astype(h.dtype), w.out_proj), w.out_bias)
    return out.reshape(B, T, D), state
