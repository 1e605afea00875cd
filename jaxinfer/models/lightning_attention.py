"""MiniMax-Text-01's lightning attention (transformers' `MiniMaxLightningAttention`) as pure functions: qkv_proj and
the activation -> per head q, k, v -> linear attention with a constant per-head decay -> RMSNorm over every head ->
times sigmoid(output_gate(x)) -> out_proj.

Per token and head: S <- exp(-rate) S + k v^T, o = q S, with no scale, norm or rotation on q and k. That is Mamba2's
recurrence with dt = 1, A = -rate, x = v, B = k and C = q, one group per head, no conv and no D skip, so the state
takes Mamba2's pools (config/state_space, cache/state_pool: the SSM state [H, P, N] is S transposed, values by keys;
the conv state has no columns) and the recurrence its two forms: the per-token scan over a step's packed tokens
(models/slot_scan), and on a GPU or TPU from `chunk_size` tokens on the chunked SSD (models/ssd_chunks), segment-aware
across requests. transformers' own block form (`block_size`) computes the same sums.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxinfer.cache.state_pool import LayerState
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.mamba2_mixer import chunked_form
from jaxinfer.models.mlp import activation
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.slot_scan import slot_scan
from jaxinfer.models.ssd_chunks import chunked_ssd, segments
from jaxinfer.parallel.array_info import ArrayInfo

NORM_EPS = 1e-6  # transformers builds the output norm with MiniMaxRMSNorm's default epsilon, not the config's


def lightning_state(layers: tuple[int, ...], heads: int, head_dim: int, block: int) -> StateSpace:
    """The lightning layers' state as Mamba2's: H heads of P = N = head_dim, a group per head, no conv."""
    return StateSpace(layers=layers, num_heads=heads, head_dim=head_dim, state_size=head_dim, n_groups=heads,
                      conv_kernel=1, conv_bias=False, chunk_size=block)


@dataclasses.dataclass(kw_only=True)
class LightningFields:
    """The mixer's leaves a lightning layer holds in attention's place (None by default only because a parent's
    fields have defaults)."""

    lightning_qkv: Weight | None = None  # [D, H, 3K]: each head's q, k, v columns in turn, as qkv_proj stores them
    lightning_gate: Weight | None = None  # [D, H K]
    lightning_norm: jax.Array | None = None  # [H K]
    lightning_out: Weight | None = None  # [H K, D]
    # [H] float32: the layer's decay rates, derived from the config and put in as the layer runs (models/minimax), so
    # every lightning layer shares one trace; None in the stored tree
    lightning_rates: jax.Array | None = None


def lightning_leaves(ss: StateSpace, hidden: int) -> dict[str, ArrayInfo]:
    """The mixer's leaves as ArrayInfos (replicated: the norm spans every head)."""
    H, K = ss.num_heads, ss.head_dim
    return dict(lightning_qkv=ArrayInfo((hidden, H, 3 * K), ("embed", None, None)),
                lightning_gate=ArrayInfo((hidden, H * K), ("embed", None)),
                lightning_norm=ArrayInfo((H * K,), (None,), init_value=1.0),
                lightning_out=ArrayInfo((H * K, hidden), (None, "embed")))


def lightning_hf_leaves(ss: StateSpace, hidden: int, prefix: str) -> dict[str, HFLeaf]:
    """Where the mixer's leaves live under `prefix` (e.g. "model.layers.{i}.self_attn.")."""
    H, K = ss.num_heads, ss.head_dim
    return dict(lightning_qkv=HFLeaf(prefix + "qkv_proj.weight", "in_heads", (3 * H * K, hidden), H, 3 * K),
                lightning_gate=HFLeaf(prefix + "output_gate.weight", "transpose", (H * K, hidden)),
                lightning_norm=HFLeaf(prefix + "norm.weight", "same", (H * K,)),
                lightning_out=HFLeaf(prefix + "out_proj.weight", "transpose", (hidden, H * K)))


def token_step(decay: jax.Array, states: tuple[jax.Array], q: jax.Array, k: jax.Array,
               v: jax.Array) -> tuple[tuple[jax.Array], jax.Array]:
    """One token of one request: S [H, P, N] decayed by decay [H], plus v k^T, read by q -> (S, o [H, P])."""
    (state,) = states
    state = decay[:, None, None] * state + v[:, :, None] * k[:, None, :]
    return (state,), jnp.einsum("hpn,hn->hp", state, q)


def recurrence(ss: StateSpace, state: LayerState, q: jax.Array, k: jax.Array, v: jax.Array, rates: jax.Array,
               positions: jax.Array) -> tuple[LayerState, jax.Array]:
    """q, k, v [T, H, K] float32 over T flat tokens (positions [T], -1 padding), each through its slot's state,
    decaying by rates [H] a token -> (the pools after them, o [T, H, K] float32)."""
    slots, num_slots = state.token_slots, state.ssm.shape[0]
    if not chunked_form(ss, q.shape[0], state.platform):
        step = functools.partial(token_step, jnp.exp(-rates))
        (ssm,), out = slot_scan(step, (state.ssm,), slots, positions, (q, k, v))
        return dataclasses.replace(state, ssm=ssm), out
    seg = segments(slots, positions, min(num_slots, positions.shape[0]))
    dt = jnp.ones(q.shape[:2], jnp.float32)
    out, final = chunked_ssd(v, k, q, dt, -rates, state.ssm, slots, positions, seg, ss.chunk_size)
    target = jnp.where(seg.valid, slots[seg.first], num_slots)  # past the segments: dropped
    return dataclasses.replace(state, ssm=state.ssm.at[target].set(final, mode="drop")), out


def lightning(ss: StateSpace, lw: LightningFields, h: jax.Array, positions: jax.Array, state: LayerState,
              act: str) -> tuple[jax.Array, LayerState]:
    """The mixer over normed hidden states h [B, T, D] at positions [B, T] (rows flattened in order, each row's
    tokens in its state's token_slots); returns its output [B, T, D] and the state after them."""
    B, T, D = h.shape
    x = h.reshape(B * T, D)
    qkv = activation(act, linear(x, lw.lightning_qkv)).astype(jnp.float32)  # [N, H, 3K]
    q, k, v = jnp.split(qkv, 3, axis=-1)
    state, out = recurrence(ss, state, q, k, v, lw.lightning_rates, positions.reshape(-1))
    normed = rms_norm(out.astype(h.dtype).reshape(B * T, ss.inner), lw.lightning_norm, NORM_EPS)
    gated = jax.nn.sigmoid(linear(x, lw.lightning_gate)) * normed
    return linear(gated, lw.lightning_out).reshape(B, T, D), state
