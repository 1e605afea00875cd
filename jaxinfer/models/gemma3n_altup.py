"""Gemma 3n's AltUp (alternating updates), LAuReL residual and sparse MLP gate, as transformers' modeling_gemma3n
computes them (`Gemma3nTextAltUp`, `Gemma3nTextLaurelBlock`, `Gemma3nTextMLP._gaussian_topk`).

The residual is A streams [A, B, T, D]: the embeddings and A - 1 learned projections of them, each rescaled to
the embeddings' RMS (`expand`, before the first layer). A layer predicts every stream from all of them with
coefficients routed on the active one (`predict`), runs attention and the MLP on the active prediction, then
moves every stream by the layer's innovation (its output minus the active prediction) times routed coefficients
(`correct`). After the last layer the streams are projected back, rescaled alike and averaged (`collapse`).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.models.layers import linear, linears
from jaxinfer.models.mlp import gate_product
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.self_attention import HIDDEN

STREAMS = (None, *HIDDEN)  # [A, B, T, D]


def _rms(x: jax.Array, floor: float = 0.0) -> jax.Array:
    """sqrt(mean(x^2)) over the last axis, at least sqrt(floor), in x's dtype (as transformers computes it)."""
    return jnp.sqrt(jnp.maximum(jnp.mean(x * x, axis=-1, keepdims=True), jnp.asarray(floor, x.dtype)))


def _rescaled(projected: jax.Array, target: jax.Array) -> jax.Array:
    """A projected stream brought to the target RMS (its own floored at 1e-5 squared, as transformers does)."""
    return projected * target / _rms(projected, 1e-5)


def expand(x: jax.Array, projections: jax.Array) -> jax.Array:
    """The streams [A, B, T, D] of embeddings x [B, T, D]: x, then x @ P_j [A-1, D, D] at x's RMS."""
    target = _rms(x)
    return jnp.stack([x] + [_rescaled(linear(x, w), target) for w in projections])


def collapse(streams: jax.Array, projections: jax.Array) -> jax.Array:
    """The streams [A, B, T, D] back to one [B, T, D]: stream 0 and streams j @ U_j at stream 0's RMS, averaged."""
    target = _rms(streams[0])
    rest = [_rescaled(linear(s, w), target) for s, w in zip(streams[1:], projections)]
    return jnp.mean(jnp.stack([streams[0]] + rest), axis=0)


def _modalities(x: jax.Array, lw: Any, eps: float) -> jax.Array:
    """tanh of the router on the normed, 1/D-scaled active stream [B, T, D] -> [B, T, A]."""
    scaled = rms_norm(x, lw.altup_router_norm, eps, scale_first=True) * jnp.asarray(1.0 / x.shape[-1], x.dtype)
    return jnp.tanh(linear(scaled, lw.altup_router).astype(jnp.float32)).astype(x.dtype)


def predict(streams: jax.Array, lw: Any, active: int, eps: float) -> jax.Array:
    """Each stream k predicted as itself plus sum_j C[k, j] * stream j, C [B, T, A, A] routed on the active one."""
    A = streams.shape[0]
    coefs = linear(_modalities(streams[active], lw, eps), lw.altup_predict)
    coefs = coefs.reshape(*coefs.shape[:-1], A, A)
    return (jnp.einsum("btkj,jbtd->kbtd", coefs, streams) + streams).astype(streams.dtype)


def correct(predictions: jax.Array, activated: jax.Array, lw: Any, active: int, eps: float) -> jax.Array:
    """Each prediction moved by the innovation (activated minus the active prediction) times (1 + routed c_k)."""
    coefs = linear(_modalities(activated, lw, eps), lw.altup_correct) + jnp.asarray(1.0, activated.dtype)
    innovation = activated - predictions[active]
    return (innovation[None] * jnp.moveaxis(coefs, -1, 0)[..., None] + predictions).astype(activated.dtype)


def laurel(x: jax.Array, lw: Any, eps: float) -> jax.Array:
    """x plus its normed low-rank residual x @ L @ R (LAuReL)."""
    return x + rms_norm(linear(linear(x, lw.laurel_left), lw.laurel_right), lw.laurel_norm, eps, scale_first=True)


def halved(x: jax.Array) -> jax.Array:
    """x / sqrt(2), divided in float32 and rounded once (as torch divides a 16-bit tensor by a Python float)."""
    return (x.astype(jnp.float32) / math.sqrt(2)).astype(x.dtype)


def sparse_gate(gate: jax.Array, sparsity: float) -> jax.Array:
    """relu(gate - (mean + std * Phi^-1(sparsity))) over each row's units: keeps about 1 - sparsity of them."""
    multiplier = jnp.asarray(NormalDist().inv_cdf(sparsity), gate.dtype)
    cutoff = jnp.mean(gate, axis=-1, keepdims=True) + jnp.std(gate, axis=-1, keepdims=True) * multiplier
    return jax.nn.relu(gate - cutoff)


def sparse_mlp(x: jax.Array, lw: Any, act: str, sparsity: float) -> jax.Array:
    """down(act(gate') * up), gate' the gate past its sparsity cutoff where the layer has one."""
    gate, up = linears(x, [lw.w_gate, lw.w_up])
    if sparsity > 0.0:
        gate = sparse_gate(gate, sparsity)
    return linear(gate_product(act, gate, up), lw.w_down)
