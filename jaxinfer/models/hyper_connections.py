"""Hyper-connections (HY-V4's iHC; DeepSeek-V4's and GLM-5.3's manifold-constrained mHC): N residual streams a token.

The embeddings enter as N copies [B, T, N, D] (`expand`). Around each sublayer (attention, the MLP) the streams,
flattened to N * D values and RMS-normed without a weight, give the sublayer's gates by one float32 projection
(`gate_logits`): a read gate pre [N] (sigmoid + eps) collapses the streams into the sublayer's input; a write gate
post [N] (post_scale * sigmoid, + eps for HY-V4) spreads its output back over them; with mHC the streams are also
mixed by a matrix [N, N] made doubly stochastic by Sinkhorn-Knopp (`sinkhorn`), added where iHC adds them as they
are (`around`). After the last layer a head collapses the streams again (`collapse_head`: a learned read gate, or
GLM-5.3's mean) before the final norm. Gates and sums run in float32, as transformers forces them.

The streams are per-token state inside one step only: nothing is cached, so every cache and engine path is a
pre-norm model's. A layer holds its two sublayers' gates (`HyperConnectionLayer`), the last one the head's too.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from jaxinfer.config.hyper_connections import HyperConnections
from jaxinfer.config.model import ModelConfig
from jaxinfer.parallel.array_info import ArrayInfo

STREAMS = ("batch", "tokens", None, "embed")  # [B, T, N, D]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class HyperConnectionLayer:
    """One layer's gates (N streams of D; G = 2N for iHC, (2 + N) N for mHC), all float32."""

    attn_hc_fn: jax.Array  # [N * D, G] attn_hc.fn, transposed
    attn_hc_base: jax.Array  # [G]
    attn_hc_scale: jax.Array  # [2] or [3]: the read, write (and mixing) logits' scales
    mlp_hc_fn: jax.Array  # [N * D, G] ffn_hc.fn, transposed
    mlp_hc_base: jax.Array  # [G]
    mlp_hc_scale: jax.Array  # [2] or [3]
    head_hc_fn: jax.Array | None = None  # [N * D, N] the last layer's: hc_head.hc_fn (gated head only)
    head_hc_base: jax.Array | None = None  # [N]
    head_hc_scale: jax.Array | None = None  # [1]


def gate_width(hc: HyperConnections) -> int:
    """G: logits a sublayer's projection gives (read and write gates, and the mixing matrix with mHC)."""
    return 2 * hc.mult + (hc.mult * hc.mult if hc.sinkhorn_iters else 0)


def hyper_connection_leaves(cfg: ModelConfig, layer: int) -> dict[str, ArrayInfo | None]:
    """The fields of `HyperConnectionLayer` as float32 ArrayInfos (the head's on the last layer only)."""
    hc = cfg.hyper_connections
    flat, width, scales = hc.mult * cfg.hidden_size, gate_width(hc), 3 if hc.sinkhorn_iters else 2
    head = layer == cfg.num_layers - 1 and hc.head == "gated"

    def info(*shape: int) -> ArrayInfo:
        return ArrayInfo(shape, (None,) * len(shape), dtype="float32", init_value=0.0 if len(shape) == 1 else None)

    sublayers = {f"{sub}_hc_{name}": info(*shape) for sub in ("attn", "mlp")
                 for name, shape in (("fn", (flat, width)), ("base", (width,)), ("scale", (scales,)))}
    return dict(**sublayers, head_hc_fn=info(flat, hc.mult) if head else None,
                head_hc_base=info(hc.mult) if head else None, head_hc_scale=info(1) if head else None)


def expand(x: jax.Array, hc: HyperConnections) -> jax.Array:
    """The streams [B, T, N, D] of the embeddings x [B, T, D]: N copies."""
    return jnp.broadcast_to(x[..., None, :], (*x.shape[:-1], hc.mult, x.shape[-1]))


def gate_logits(streams: jax.Array, fn: jax.Array, hc: HyperConnections) -> jax.Array:
    """The projection [B, T, G] float32 of the streams [B, T, N, D] flattened and RMS-normed (no weight)."""
    flat = streams.reshape(*streams.shape[:-2], -1).astype(jnp.float32)
    inv_rms = jax.lax.rsqrt(jnp.mean(flat * flat, axis=-1, keepdims=True) + hc.norm_eps)
    return jnp.dot(flat, fn.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST) * inv_rms


def sinkhorn(logits: jax.Array, iters: int, eps: float) -> jax.Array:
    """The mixing matrix [..., N, N] of its logits: a row softmax (+ eps), then columns and rows normalised in turn
    (columns first and last), as transformers' DeepseekV4HyperConnection does."""
    comb = jax.nn.softmax(logits, axis=-1) + eps
    comb = comb / (jnp.sum(comb, axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (jnp.sum(comb, axis=-1, keepdims=True) + eps)
        comb = comb / (jnp.sum(comb, axis=-2, keepdims=True) + eps)
    return comb


def read_gates(
    streams: jax.Array, fn: jax.Array, base: jax.Array, scale: jax.Array, hc: HyperConnections,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """A sublayer's read gate [B, T, N], write gate [B, T, N] and mixing matrix [B, T, N, N] (None for iHC)."""
    n = hc.mult
    logits = gate_logits(streams, fn, hc)
    pre = jax.nn.sigmoid(logits[..., :n] * scale[0] + base[:n]) + hc.eps
    post = hc.post_scale * jax.nn.sigmoid(logits[..., n:2 * n] * scale[1] + base[n:2 * n])
    post = post + hc.eps if hc.post_eps else post
    if not hc.sinkhorn_iters:
        return pre, post, None
    mixing = logits[..., 2 * n:] * scale[2] + base[2 * n:]
    return pre, post, sinkhorn(mixing.reshape(*mixing.shape[:-1], n, n), hc.sinkhorn_iters, hc.eps)


def weighted_sum(streams: jax.Array, gate: jax.Array) -> jax.Array:
    """sum_n gate[n] * streams[n]: [B, T, D] in the streams' dtype (float32 products, rounded once)."""
    return jnp.einsum("btn,btnd->btd", gate, streams.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST).astype(streams.dtype)


def around(
    streams: jax.Array, fn: jax.Array, base: jax.Array, scale: jax.Array, hc: HyperConnections,
    sublayer: Callable[[jax.Array], jax.Array],
) -> jax.Array:
    """The streams after one sublayer: its output [B, T, D] on the read-gated sum of the streams, times the write
    gate, added to each stream (to the mixed streams with mHC: stream k gets sum_j comb[j, k] stream j)."""
    pre, post, comb = read_gates(streams, fn, base, scale, hc)
    out = sublayer(weighted_sum(streams, pre)).astype(jnp.float32)
    kept = streams.astype(jnp.float32)
    if comb is not None:
        kept = jnp.einsum("btjk,btjd->btkd", comb, kept, precision=jax.lax.Precision.HIGHEST)
    return (post[..., None] * out[..., None, :] + kept).astype(streams.dtype)


def collapse_head(streams: jax.Array, lw: HyperConnectionLayer, hc: HyperConnections) -> jax.Array:
    """The one hidden state [B, T, D] the final norm reads: the streams under the head's read gate (sigmoid + eps),
    or their mean (GLM-5.3)."""
    if hc.head == "mean":
        return jnp.mean(streams.astype(jnp.float32), axis=-2).astype(streams.dtype)
    logits = gate_logits(streams, lw.head_hc_fn, hc)
    return weighted_sum(streams, jax.nn.sigmoid(logits * lw.head_hc_scale[0] + lw.head_hc_base) + hc.eps)
