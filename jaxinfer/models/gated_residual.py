"""Qwen4-Exp's gated residual over S copies of the residual stream (transformers' `Qwen4ExpTextGatedResidual`).

The residual is S streams side by side, [..., S * D] (the embeddings repeated S times before the first layer).
Around each sublayer the streams are RMS-normed each on its own (one zero-centred weight over all S * D), a
rank-R gate (silu down, sigmoid up) weighs every stream's dims, and the sublayer reads their mean; its output
is added back to every stream, stream s's copy scaled by 2 * sigmoid(a learned logit of the normed streams / S).
After the last layer the same mean (no write-back) is the decoder's output: no final norm.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import Weight, linear
from jaxinfer.parallel.array_info import ArrayInfo


@dataclasses.dataclass(frozen=True)
class StreamGate:
    """One gated read of the streams: a layer's leaves `{prefix}_norm`, `_down`, `_up`, `_inject` seen together."""

    norm: jax.Array  # [S * D] zero-centred
    down: Weight  # [S * D, R]
    up: Weight  # [R, S * D]
    inject: Weight | None = None  # [S * D, S]; None: the final mixer, which writes nothing back

    @classmethod
    def of(cls, lw: Any, prefix: str) -> "StreamGate":
        """The gate `prefix` of layer weights lw."""
        return cls(*(getattr(lw, f"{prefix}_{name}", None) for name in ("norm", "down", "up", "inject")))


def stream_gate_leaves(prefix: str, streams: int, hidden: int, rank: int, writes_back: bool = True) -> dict[str, Any]:
    """A gate's leaves as ArrayInfos, named `{prefix}_norm`, `_down`, `_up` and (where it writes back) `_inject`."""
    width = streams * hidden
    leaves = dict(norm=ArrayInfo((width,), (None,), init_value=0.0), down=ArrayInfo((width, rank), (None, None)),
                  up=ArrayInfo((rank, width), (None, None)))
    if writes_back:
        leaves["inject"] = ArrayInfo((width, streams), (None, None))
    return {f"{prefix}_{name}": info for name, info in leaves.items()}


def stream_gate_hf_leaves(prefix: str, module: str, streams: int, hidden: int, rank: int,
                          writes_back: bool = True) -> dict[str, HFLeaf]:
    """Where a gate's leaves live: transformers' `{module}.hc_norm`, `input_mix_weight_down`, `_up`,
    `block_inject_weight`."""
    width = streams * hidden
    leaves = dict(norm=HFLeaf(module + "hc_norm.weight", "same", (width,)),
                  down=HFLeaf(module + "input_mix_weight_down.weight", "transpose", (rank, width)),
                  up=HFLeaf(module + "input_mix_weight_up.weight", "transpose", (width, rank)))
    if writes_back:
        leaves["inject"] = HFLeaf(module + "block_inject_weight.weight", "transpose", (streams, width))
    return {f"{prefix}_{name}": leaf for name, leaf in leaves.items()}


def grouped_rms_norm(x: jax.Array, weight: jax.Array, group: int, eps: float) -> jax.Array:
    """x [..., S * group] RMS-normed over each run of `group` dims, times (1 + weight) [S * group], in float32, then
    cast back (transformers' Qwen4ExpTextRMSNorm with a group_size)."""
    x32 = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, group)
    normed = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).reshape(x.shape)
    return (normed * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)


def read_streams(gate: StreamGate, x: jax.Array, streams: int, eps: float) -> tuple[jax.Array, jax.Array | None]:
    """The residual x [..., S * D] -> the sublayer's input [..., D] and the write-back's weights [..., S] (None for
    the final mixer)."""
    hidden = x.shape[-1] // streams
    normed = grouped_rms_norm(x, gate.norm, hidden, eps)
    weights = jax.nn.sigmoid(linear(jax.nn.silu(linear(normed, gate.down) / streams), gate.up))
    split = (*x.shape[:-1], streams, hidden)
    mixed = jnp.mean(weights.reshape(split) * normed.reshape(split), axis=-2)
    if gate.inject is None:
        return mixed, None
    return mixed, 2 * jax.nn.sigmoid(linear(normed, gate.inject) / streams)


def write_streams(x: jax.Array, out: jax.Array, weights: jax.Array) -> jax.Array:
    """The residual x [..., S * D] plus the sublayer's output out [..., D] in every stream, scaled by weights
    [..., S]."""
    return x + (out[..., None, :] * weights[..., None]).reshape(x.shape)
