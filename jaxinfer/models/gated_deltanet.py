"""Gated DeltaNet (Qwen3-Next's and Qwen3.5's `linear_attention` layers) as pure functions: the input projections
-> a causal depthwise conv over (q, k, v) with SiLU -> the gated delta rule per value head -> gated RMSNorm ->
out_proj. Qwen3-Next fuses the projections in two tensors interleaved per key head (in_proj_qkvz, in_proj_ba);
Qwen3.5 stores four apart, each in plain head order (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a: the `split` leaves);
OLMo Hybrid six (q, k, v, the gate z, b, a: `APART_PROJECTIONS`) and its conv's weight per input (q, k, v).

The recurrence is transformers' `torch_recurrent_gated_delta_rule`: q and k L2-normed, q scaled by
key_dim ** -0.5; each value head's state S decays by exp(g), g = -exp(A_log) * softplus(a + dt_bias), then
takes the delta rule's correction beta * (v - S k) k^T, beta = sigmoid(b) (2 sigmoid(b) where `beta_scale` says:
OLMo Hybrid's linear_allow_neg_eigval), and the head reads y = S q. Each value_heads / key_heads value heads share
one q/k head.

The state has Mamba2's shapes (config/state_space, cache/state_pool), by `deltanet_state`'s mapping: the conv
state [K-1, C] holds the last q, k, v inputs (C = 2 * key_heads * key_dim + value_heads * value_dim = Mamba2's
inner + 2 * G * N), the SSM state [H, P, N] each value head's S as [value_dim, key_dim] (transformers keeps its
transpose). The recurrence is a per-token scan over the step's packed tokens (models/slot_scan); on a GPU or
TPU a step of at least CHUNK tokens runs the chunked form instead (models/delta_chunks: the UT transform within
chunks, segment-aware across requests), as Mamba2's mixer picks its chunked SSD (mamba2_mixer.chunked_form).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxinfer.cache.state_pool import LayerState
from jaxinfer.config.model import ConfigError
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.delta_chunks import chunked_delta
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import linear, linears
from jaxinfer.models.mamba2_mixer import chunked_form
from jaxinfer.models.slot_scan import slot_scan
from jaxinfer.models.ssd_chunks import conv_windows, segments
from jaxinfer.parallel.array_info import ArrayInfo

L2_EPS = 1e-6  # the FLA kernels' (and transformers' l2norm) epsilon for q and k
CHUNK = 64  # the chunked form's chunk (transformers' and FLA's): a step of this many tokens runs it on accelerators
# The input projections each stored apart (OLMo Hybrid's q_proj, k_proj, v_proj, g_proj, b_proj, a_proj)
APART_PROJECTIONS = ("in_q", "in_k", "in_v", "in_z", "in_b", "in_a")


def deltanet_state(layers: tuple[int, ...], key_heads: int, key_dim: int, value_heads: int, value_dim: int,
                   conv_kernel: int, eps: float) -> StateSpace:
    """The state layers' dims as Mamba2's: H value heads of P = value_dim, G = key_heads groups of N = key_dim."""
    if value_heads % key_heads:
        raise ConfigError(f"linear_num_value_heads ({value_heads}) must be a multiple of linear_num_key_heads "
                          f"({key_heads}): each q/k head serves a whole group of value heads")
    return StateSpace(layers=layers, num_heads=value_heads, head_dim=value_dim, state_size=key_dim,
                      n_groups=key_heads, conv_kernel=conv_kernel, conv_bias=False, norm_eps=eps, chunk_size=CHUNK)


def _key_width(ss: StateSpace) -> int:
    """q's (and k's) channels: key_heads * key_dim."""
    return ss.n_groups * ss.state_size


def _projection_widths(ss: StateSpace, split: bool) -> dict[str, int]:
    """Each input projection leaf's output width: fused (in_qkvz, in_ba) or split (Qwen3.5's four)."""
    H, V = ss.num_heads, ss.inner
    if split:
        return {"in_qkv": 2 * _key_width(ss) + V, "in_z": V, "in_b": H, "in_a": H}
    return {"in_qkvz": 2 * _key_width(ss) + 2 * V, "in_ba": 2 * H}


def deltanet_leaves(ss: StateSpace, hidden: int, split: bool = False) -> dict[str, ArrayInfo]:
    """The mixer's leaves as ArrayInfos (in_qkvz keeps transformers' per-key-head interleaving; `split`: Qwen3.5's
    four projections in their place)."""
    H, V = ss.num_heads, ss.inner
    return dict(
        **{name: ArrayInfo((hidden, width), ("embed", None)) for name, width in _projection_widths(ss, split).items()},
        conv_weight=ArrayInfo((ss.conv_dim, 1, ss.conv_kernel), (None, None, None), init_std=0.3),
        dt_bias=ArrayInfo((H,), (None,), init_value=1.0),
        a_log=ArrayInfo((H,), (None,), init_value=0.0),
        gate_norm=ArrayInfo((ss.head_dim,), (None,), init_value=1.0),
        out_proj=ArrayInfo((V, hidden), (None, "embed")),
    )


def deltanet_hf_leaves(ss: StateSpace, hidden: int, prefix: str, split: bool = False) -> dict[str, HFLeaf]:
    """Where the mixer's leaves live under `prefix` (e.g. "model.layers.{i}.linear_attn."); leaf in_X is
    tensor in_proj_X."""
    H, V = ss.num_heads, ss.inner
    return dict(
        **{name: HFLeaf(f"{prefix}in_proj_{name[3:]}.weight", "transpose", (width, hidden))
           for name, width in _projection_widths(ss, split).items()},
        conv_weight=HFLeaf(prefix + "conv1d.weight", "same", (ss.conv_dim, 1, ss.conv_kernel)),
        dt_bias=HFLeaf(prefix + "dt_bias", "same", (H,)),
        a_log=HFLeaf(prefix + "A_log", "same", (H,)),
        gate_norm=HFLeaf(prefix + "norm.weight", "same", (ss.head_dim,)),
        out_proj=HFLeaf(prefix + "out_proj.weight", "transpose", (hidden, V)),
    )


def split_projections(
    ss: StateSpace, qkvz: jax.Array, ba: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """in_proj_qkvz's [N, 2Kd + 2Vd] and in_proj_ba's [N, 2H] outputs, each interleaved per key head as
    transformers' fix_query_key_value_ordering reads them -> the conv's inputs [N, C] (all q, all k, all v), the
    gate z [N, H, P] and b, a [N, H]."""
    N, G, N_k, P = qkvz.shape[0], ss.n_groups, ss.state_size, ss.head_dim
    r = ss.num_heads // G
    q, k, v, z = jnp.split(qkvz.reshape(N, G, 2 * N_k + 2 * r * P), [N_k, 2 * N_k, 2 * N_k + r * P], axis=-1)
    b, a = jnp.split(ba.reshape(N, G, 2 * r), [r], axis=-1)
    qkv = jnp.concatenate([q.reshape(N, -1), k.reshape(N, -1), v.reshape(N, -1)], axis=-1)
    return qkv, z.reshape(N, ss.num_heads, P), b.reshape(N, -1), a.reshape(N, -1)


def mixer_inputs(ss: StateSpace, w: Any, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Normed rows x [N, D] -> the conv's inputs [N, C], z [N, H, P], b and a [N, H], through the fused projections,
    the split ones or the six apart (whichever the layer has)."""
    if getattr(w, "in_qkvz", None) is not None:
        return split_projections(ss, linear(x, w.in_qkvz), linear(x, w.in_ba))
    if getattr(w, "in_q", None) is not None:
        q, k, v, z, b, a = linears(x, [getattr(w, name) for name in APART_PROJECTIONS])
        return jnp.concatenate([q, k, v], axis=-1), z.reshape(x.shape[0], ss.num_heads, ss.head_dim), b, a
    z = linear(x, w.in_z).reshape(x.shape[0], ss.num_heads, ss.head_dim)
    return linear(x, w.in_qkv), z, linear(x, w.in_b), linear(x, w.in_a)


def conv_weight(w: Any) -> jax.Array:
    """The conv's weight [C, 1, K]: one tensor, or q's, k's and v's stored apart (OLMo Hybrid's) joined in order."""
    if getattr(w, "conv_weight", None) is not None:
        return w.conv_weight
    return jnp.concatenate([w.conv_q, w.conv_k, w.conv_v])


def l2_normed(x: jax.Array) -> jax.Array:
    """x over its last axis divided by its L2 norm (FLA's epsilon)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def conv_qkv(ss: StateSpace, conv_weight: jax.Array, window: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Conv windows [..., K, C] through conv_weight [C, 1, K] -> q and k [..., H, N] (L2-normed, each q/k head
    repeated for its value heads, q scaled by N ** -0.5) and v [..., H, P], in float32."""
    mixed = jax.nn.silu(jnp.sum(window * conv_weight[:, 0].T.astype(jnp.float32), axis=-2))
    q, k, v = jnp.split(mixed, [_key_width(ss), 2 * _key_width(ss)], axis=-1)
    lead, r = mixed.shape[:-1], ss.num_heads // ss.n_groups
    q, k = (jnp.repeat(l2_normed(x.reshape(*lead, ss.n_groups, -1)), r, axis=-2) for x in (q, k))
    return q * ss.state_size**-0.5, k, v.reshape(*lead, ss.num_heads, ss.head_dim)


def token_step(
    ss: StateSpace, conv_weight: jax.Array, states: tuple[jax.Array, jax.Array], qkv: jax.Array, g: jax.Array,
    beta: jax.Array,
) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
    """One token of one request: (conv state [K-1, C], S [H, P, N]), its conv input qkv [C], log decay g [H] (per
    head) or [H, N] (per key channel: Kimi Delta Attention) and beta [H] -> (the states after it, y [H, P]), in
    float32."""
    conv, state = states
    window = jnp.concatenate([conv, qkv[None]], axis=0)  # [K, C]
    q, k, v = conv_qkv(ss, conv_weight, window)
    state = state * jnp.exp(g).reshape(g.shape[0], 1, -1)  # over S's key axis: [H, 1, 1] or [H, 1, N]
    delta = (v - jnp.einsum("hpn,hn->hp", state, k)) * beta[:, None]
    state = state + delta[:, :, None] * k[:, None, :]
    return (window[1:], state), jnp.einsum("hpn,hn->hp", state, q)


def packed_scan(ss: StateSpace, conv_weight: jax.Array, state: LayerState, qkv: jax.Array, g: jax.Array,
                beta: jax.Array, positions: jax.Array) -> tuple[LayerState, jax.Array]:
    """The recurrence over T flat tokens (qkv [T, C], g [T, H] or [T, H, N], beta [T, H], positions [T], -1
    padding), each through its slot's state (models/slot_scan); returns the pools after them and y [T, H, P]
    float32."""
    step = functools.partial(token_step, ss, conv_weight)
    (conv, ssm), y = slot_scan(step, (state.conv, state.ssm), state.token_slots, positions, (qkv, g, beta))
    return dataclasses.replace(state, conv=conv, ssm=ssm), y


def packed_chunked(ss: StateSpace, conv_weight: jax.Array, state: LayerState, qkv: jax.Array, g: jax.Array,
                   beta: jax.Array, positions: jax.Array) -> tuple[LayerState, jax.Array]:
    """`packed_scan`'s result through the chunked delta rule (models/delta_chunks) in chunks of ss.chunk_size."""
    slots, num_slots = state.token_slots, state.conv.shape[0]
    seg = segments(slots, positions, min(num_slots, positions.shape[0]))
    windows = conv_windows(state.conv, qkv, slots, positions, seg)  # [T, K, C]
    q, k, v = conv_qkv(ss, conv_weight, windows)
    y, final = chunked_delta(q, k, v, g, beta, state.ssm, slots, positions, seg, ss.chunk_size)
    target = jnp.where(seg.valid, slots[seg.first], num_slots)  # past the segments: dropped
    conv = state.conv.at[target].set(windows[seg.last, 1:], mode="drop")
    ssm = state.ssm.at[target].set(final, mode="drop")
    return dataclasses.replace(state, conv=conv, ssm=ssm), y


def gated_rms_norm(y: jax.Array, z: jax.Array, weight: jax.Array, eps: float,
                   gate: Callable[[jax.Array], jax.Array] = jax.nn.silu, strict_fp32: bool = False) -> jax.Array:
    """y [N, H, P] RMS-normed per head in float32, times weight in y's dtype, then times gate(z) (transformers'
    Qwen3NextRMSNormGated: the norm before the gate, unlike Mamba2's); in y's dtype. Kimi Delta Attention's
    (`gate` sigmoid, `strict_fp32`) takes the weight in float32 too, the normed y never rounded to y's dtype."""
    y32 = y.astype(jnp.float32)
    normed = y32 * jax.lax.rsqrt(jnp.mean(y32 * y32, axis=-1, keepdims=True) + eps)
    if strict_fp32:
        scaled = weight.astype(jnp.float32) * normed
    else:
        scaled = (weight * normed.astype(y.dtype)).astype(jnp.float32)
    return (scaled * gate(z.astype(jnp.float32))).astype(y.dtype)


def deltanet(
    ss: StateSpace, w: Any, h: jax.Array, positions: jax.Array, state: LayerState
) -> tuple[jax.Array, LayerState]:
    """The mixer over normed hidden states h [B, T, D] at positions [B, T] (rows flattened in order, each row's
    tokens in its state's token_slots); returns its output [B, T, D] and the state after them."""
    B, T, D = h.shape
    x = h.reshape(B * T, D)
    qkv, z, b, a = mixer_inputs(ss, w, x)
    g = -jnp.exp(w.a_log.astype(jnp.float32)) * jax.nn.softplus(a.astype(jnp.float32) + w.dt_bias.astype(jnp.float32))
    beta = (ss.beta_scale * jax.nn.sigmoid(b)).astype(jnp.float32)
    recurrence = packed_chunked if chunked_form(ss, B * T, state.platform) else packed_scan
    state, y = recurrence(ss, conv_weight(w), state, qkv.astype(jnp.float32), g, beta, positions.reshape(-1))
    normed = gated_rms_norm(y.astype(h.dtype), z, w.gate_norm, ss.norm_eps, strict_fp32=ss.strict_gate_norm)
    out = linear(normed.reshape(B * T, ss.inner), w.out_proj)
    return out.reshape(B, T, D), state
