"""LFM2's gated short convolution as pure functions: in_proj to (B, C, x) -> B * x -> causal depthwise conv of
`conv_kernel` taps -> C * conv -> out_proj.

No recurrence past the conv: each token's output reads its own B, C and x and the kernel - 1 products before it,
so a step's tokens run at once. Those earlier products come from the token's own run of the step, before it from
its slot's conv state (cache/state_pool; zeros at a request's position 0): ssd_chunks.depthwise_conv, the
segment-aware conv of Mamba2's chunked form. Each request's last kernel - 1 products go back to its slot; padding
tokens write nothing.
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
from jaxinfer.models.ssd_chunks import depthwise_conv, segments
from jaxinfer.parallel.array_info import ArrayInfo


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ShortConvWeights:
    """One short conv's weights (D = hidden size = the conv's channels, K taps)."""

    conv_in: Weight  # [D, 3D]: B, C, x
    conv_weight: jax.Array  # [D, 1, K] as HF stores the depthwise Conv1d
    conv_out: Weight  # [D, D]
    conv_in_bias: jax.Array | None = None  # [3D]
    conv_bias: jax.Array | None = None  # [D]
    conv_out_bias: jax.Array | None = None  # [D]

    PROJECTIONS: ClassVar[dict[str, int]] = {"conv_in": 1, "conv_out": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = ()


def short_conv_leaves(ss: StateSpace) -> dict[str, ArrayInfo | None]:
    """The conv's leaves as ArrayInfos (the `ShortConvWeights` fields; the biases by ss.conv_bias, ss.proj_bias)."""
    D, K = ss.conv_dim, ss.conv_kernel
    return dict(
        conv_in=ArrayInfo((D, 3 * D), ("embed", None)),
        conv_weight=ArrayInfo((D, 1, K), (None, None, None), init_std=0.3),
        conv_out=ArrayInfo((D, D), (None, "embed")),
        conv_in_bias=ArrayInfo((3 * D,), (None,)) if ss.proj_bias else None,
        conv_bias=ArrayInfo((D,), (None,)) if ss.conv_bias else None,
        conv_out_bias=ArrayInfo((D,), ("embed",)) if ss.proj_bias else None,
    )


def short_conv_hf_leaves(ss: StateSpace, prefix: str) -> dict[str, HFLeaf]:
    """Where the conv's leaves live under `prefix` (e.g. "model.layers.{i}.conv.")."""
    D, K = ss.conv_dim, ss.conv_kernel
    leaves = dict(
        conv_in=HFLeaf(prefix + "in_proj.weight", "transpose", (3 * D, D)),
        conv_weight=HFLeaf(prefix + "conv.weight", "same", (D, 1, K)),
        conv_out=HFLeaf(prefix + "out_proj.weight", "transpose", (D, D)),
    )
    if ss.conv_bias:
        leaves["conv_bias"] = HFLeaf(prefix + "conv.bias", "same", (D,))
    if ss.proj_bias:
        leaves["conv_in_bias"] = HFLeaf(prefix + "in_proj.bias", "same", (3 * D,))
        leaves["conv_out_bias"] = HFLeaf(prefix + "out_proj.bias", "same", (D,))
    return leaves


def _biased(y: jax.Array, bias: jax.Array | None) -> jax.Array:
    return y if bias is None else y + bias.astype(y.dtype)


def short_conv(
    w: ShortConvWeights, h: jax.Array, positions: jax.Array, state: LayerState
) -> tuple[jax.Array, LayerState]:
    """The conv over normed hidden states h [B, T, D] at positions [B, T] (rows flattened in order, each row's tokens
    in its state's token_slots); returns its output [B, T, D] and the state after them."""
    B, T, D = h.shape
    b, c, x = jnp.split(_biased(linear(h.reshape(B * T, D), w.conv_in), w.conv_in_bias), 3, axis=-1)
    slots, flat = state.token_slots, positions.reshape(-1)
    seg = segments(slots, flat, min(state.conv.shape[0], B * T))
    mixed, conv = depthwise_conv(state.conv, w.conv_weight, w.conv_bias, b * x, slots, flat, seg)
    out = _biased(linear(c * mixed.astype(h.dtype), w.conv_out), w.conv_out_bias)
    return out.reshape(B, T, D), dataclasses.replace(state, conv=conv)
