"""Griffin's recurrent block (RecurrentGemma; transformers' RecurrentGemmaRecurrentBlock) as pure functions.

Two branches of the normed input h: y = act(linear_y(h)), and x = linear_x(h) through a causal depthwise conv (no
activation) and the Real-Gated Linear Recurrent Unit; the block's output is linear_out(rg_lru(conv(x)) * y).

The RG-LRU keeps one value per channel: per token, gates from block-diagonal projections of x (one [bw, bw] block
per head), i = sigmoid(x W_i + b_i) and r = sigmoid(x W_r + b_r), the decay a = exp(-8 r softplus(decay_param))
(Griffin's constant c = 8), and h <- a h + sqrt(1 - a^2) (i x), the multiplier 1 at a request's position 0 (where
h starts from zeros). Its output is h. A request's state is the conv's last K - 1 inputs and h [W], kept per row slot
in the state pools (cache/state_pool; h as [S, W, 1, 1]: channels as heads of one dim and one state entry,
`StateSpace.rg_lru`). The conv runs a step's tokens at once through segment-aware windows (models/ssd_chunks); the
recurrence is `slot_scan`'s per-token scan, or, for steps of `chunk_size` tokens or more on a GPU or TPU (picked as
Mamba's: `mamba2_mixer.chunked_form`), Mamba-1's chunked associative scan (`selective_chunks.chunked_linear_scan`,
its state one entry per channel). The gates are computed in float32 (transformers computes them in the model's
dtype, so its bfloat16 decay rounds a 0.999 to 1).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxinfer.cache.state_pool import LayerState
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import Weight, linear, linears
from jaxinfer.models.mamba2_mixer import chunked_form
from jaxinfer.models.mlp import activation
from jaxinfer.models.selective_chunks import chunk_tokens, chunked_linear_scan
from jaxinfer.models.slot_scan import slot_scan
from jaxinfer.models.ssd_chunks import Segments, depthwise_conv, segments
from jaxinfer.parallel.array_info import ArrayInfo

DECAY_SCALE = -8.0  # Griffin's c: log a = c * r * softplus(decay_param)


@dataclasses.dataclass
class RecurrentFields:
    """The recurrent block's weights (W = lru_width, H heads of bw = W / H for the gates, K conv taps) a layer adds
    after its parent's; None by default only because the parent's fields have defaults."""

    lru_x: Weight | None = None  # [D, W] linear_x
    lru_y: Weight | None = None  # [D, W] linear_y
    lru_out: Weight | None = None  # [W, D] linear_out
    lru_x_bias: jax.Array | None = None  # [W]
    lru_y_bias: jax.Array | None = None  # [W]
    lru_out_bias: jax.Array | None = None  # [D]
    conv_weight: jax.Array | None = None  # [W, 1, K] as HF stores the depthwise Conv1d
    conv_bias: jax.Array | None = None  # [W]
    input_gate: jax.Array | None = None  # [H, bw, bw]: [in, out] per head
    input_gate_bias: jax.Array | None = None  # [H, bw]
    decay_gate: jax.Array | None = None  # [H, bw, bw] (HF's recurrent_gate_weight)
    decay_gate_bias: jax.Array | None = None  # [H, bw]
    decay_param: jax.Array | None = None  # [W] (HF's recurrent_param)

    PROJECTIONS: ClassVar[dict[str, int]] = {"lru_x": 1, "lru_y": 1, "lru_out": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("lru_x", "lru_y"),)


def recurrent_leaves(ss: StateSpace, hidden: int, heads: int) -> dict[str, ArrayInfo]:
    """The block's leaves as ArrayInfos (the `RecurrentFields`), its gates in `heads` blocks."""
    W, K = ss.conv_dim, ss.conv_kernel
    bw = W // heads
    vector = lambda n, axis=None: ArrayInfo((n,), (axis,))  # noqa: E731
    block = ArrayInfo((heads, bw, bw), (None, None, None), init_std=0.3)
    return dict(
        lru_x=ArrayInfo((hidden, W), ("embed", None)), lru_y=ArrayInfo((hidden, W), ("embed", None)),
        lru_out=ArrayInfo((W, hidden), (None, "embed")),
        lru_x_bias=vector(W), lru_y_bias=vector(W), lru_out_bias=vector(hidden, "embed"),
        conv_weight=ArrayInfo((W, 1, K), (None, None, None), init_std=0.3), conv_bias=vector(W),
        input_gate=block, input_gate_bias=ArrayInfo((heads, bw), (None, None)),
        decay_gate=block, decay_gate_bias=ArrayInfo((heads, bw), (None, None)),
        decay_param=ArrayInfo((W,), (None,), init_value=1.0),
    )


def recurrent_hf_leaves(ss: StateSpace, hidden: int, heads: int, prefix: str) -> dict[str, HFLeaf]:
    """Where the block's leaves live under `prefix` ("model.layers.{i}.temporal_block.")."""
    W, K = ss.conv_dim, ss.conv_kernel
    bw, lru = W // heads, prefix + "rg_lru."
    return dict(
        lru_x=HFLeaf(prefix + "linear_x.weight", "transpose", (W, hidden)),
        lru_y=HFLeaf(prefix + "linear_y.weight", "transpose", (W, hidden)),
        lru_out=HFLeaf(prefix + "linear_out.weight", "transpose", (hidden, W)),
        lru_x_bias=HFLeaf(prefix + "linear_x.bias", "same", (W,)),
        lru_y_bias=HFLeaf(prefix + "linear_y.bias", "same", (W,)),
        lru_out_bias=HFLeaf(prefix + "linear_out.bias", "same", (hidden,)),
        conv_weight=HFLeaf(prefix + "conv_1d.weight", "same", (W, 1, K)),
        conv_bias=HFLeaf(prefix + "conv_1d.bias", "same", (W,)),
        input_gate=HFLeaf(lru + "input_gate_weight", "same", (heads, bw, bw)),
        input_gate_bias=HFLeaf(lru + "input_gate_bias", "same", (heads, bw)),
        decay_gate=HFLeaf(lru + "recurrent_gate_weight", "same", (heads, bw, bw)),
        decay_gate_bias=HFLeaf(lru + "recurrent_gate_bias", "same", (heads, bw)),
        decay_param=HFLeaf(lru + "recurrent_param", "same", (W,)),
    )


def _gate(x: jax.Array, weight: jax.Array, bias: jax.Array) -> jax.Array:
    """sigmoid of a block-diagonal projection of x [T, W] (weight [H, bw, bw], bias [H, bw]): [T, W], float32."""
    heads = weight.shape[0]
    blocks = x.astype(jnp.float32).reshape(x.shape[0], heads, -1)
    out = jnp.einsum("thi,hio->tho", blocks, weight.astype(jnp.float32)) + bias.astype(jnp.float32)
    return jax.nn.sigmoid(out).reshape(x.shape)


def lru_inputs(w: RecurrentFields, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The conv's output x [T, W] at positions [T] -> (the decay a [T, W], the normalized input
    sqrt(1 - a^2) (i x) [T, W], the multiplier 1 at position 0), float32."""
    log_a = DECAY_SCALE * _gate(x, w.decay_gate, w.decay_gate_bias) * jax.nn.softplus(
        w.decay_param.astype(jnp.float32))
    multiplier = jnp.where((positions == 0)[:, None], 1.0, jnp.sqrt(1.0 - jnp.exp(2.0 * log_a)))
    return jnp.exp(log_a), x.astype(jnp.float32) * _gate(x, w.input_gate, w.input_gate_bias) * multiplier


def token_step(states: tuple[jax.Array], a: jax.Array, u: jax.Array) -> tuple[tuple[jax.Array], jax.Array]:
    """One token of one request: its state [W, 1, 1], a and u [W] -> (the state after it, h [W]), float32."""
    h = states[0][:, 0, 0] * a + u
    return (h[:, None, None],), h


def packed_scan(ss: StateSpace, state: LayerState, a: jax.Array, u: jax.Array, positions: jax.Array,
                seg: Segments) -> tuple[jax.Array, jax.Array]:
    """The recurrence token by token (a and u [T, W] float32, positions [T], -1 padding) through each token's slot
    state: (the pool [S, W, 1, 1] after the step, h [T, W])."""
    (ssm,), h = slot_scan(token_step, (state.ssm,), state.token_slots, positions, (a, u))
    return ssm, h


def packed_chunked(ss: StateSpace, state: LayerState, a: jax.Array, u: jax.Array, positions: jax.Array,
                   seg: Segments) -> tuple[jax.Array, jax.Array]:
    """`packed_scan`'s result in chunks of `selective_chunks.chunk_tokens(ss)` (an associative scan within each)."""
    terms = lambda a, u: (a[:, :, None], u[:, :, None])  # noqa: E731
    readout = lambda states, a, u: states[:, :, 0]  # noqa: E731
    return chunked_linear_scan(terms, readout, (a, u), state.ssm, state.token_slots, positions, seg,
                               chunk_tokens(ss))


def recurrent_block(
    ss: StateSpace, w: RecurrentFields, h: jax.Array, positions: jax.Array, state: LayerState, act: str
) -> tuple[jax.Array, LayerState]:
    """The block over normed hidden states h [B, T, D] at positions [B, T] (rows flattened in order, each row's
    tokens in its state's token_slots; act the y branch's activation); its output [B, T, D] and the state after."""
    B, T, D = h.shape
    flat = positions.reshape(-1)
    x, y = linears(h.reshape(B * T, D), [w.lru_x, w.lru_y])
    x, y = x + w.lru_x_bias.astype(x.dtype), y + w.lru_y_bias.astype(y.dtype)
    seg = segments(state.token_slots, flat, min(state.conv.shape[0], flat.shape[0]))
    x, conv_pool = depthwise_conv(state.conv, w.conv_weight, w.conv_bias, x, state.token_slots, flat, seg)
    a, u = lru_inputs(w, x.astype(h.dtype), flat)
    recurrence = packed_chunked if chunked_form(ss, B * T, state.platform) else packed_scan
    ssm, lru = recurrence(ss, state, a, u, flat, seg)
    gated = lru.astype(h.dtype) * activation(act, y.astype(jnp.float32)).astype(h.dtype)
    out = linear(gated, w.lru_out) + w.lru_out_bias.astype(h.dtype)
    return out.reshape(B, T, D), dataclasses.replace(state, conv=conv_pool, ssm=ssm)
