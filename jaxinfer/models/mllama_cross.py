"""Llama 3.2 Vision's gated cross-attention layer (transformers' MllamaCrossAttentionDecoderLayer) over one image's
vision states (models/mllama_vision). Not run by the engine yet (models/mllama runs text, skipping these layers as
transformers does without an image); tests/test_mllama_vision.py checks it against transformers.

x + tanh(attn_gate) * o(attention(q_norm(q(norm(x))), k_norm(k(states)), v(states))), then
x + tanh(mlp_gate) * row_on * mlp(norm'(x)). Which vision states a text token sees follows transformers' masks: a
token at or after the image's `<|image|>` token sees the image's used tiles (the first `visible` states); a token
before it has its whole row masked, which transformers turns into no mask at all (the row times 0), so it sees every
state, the unused tiles' too, and only its MLP output is zeroed (`full_text_row_masked_out_mask`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class CrossLayer:
    """One cross-attention decoder layer's weights."""

    attn_norm: jax.Array  # [D]
    wq: jax.Array  # [D, H, K]
    wk: jax.Array  # [D, KV, K]
    wv: jax.Array  # [D, KV, K]
    wo: jax.Array  # [H, K, D]
    q_norm: jax.Array  # [K]
    k_norm: jax.Array  # [K]
    attn_gate: jax.Array  # [1]
    mlp_norm: jax.Array  # [D]
    w_gate: jax.Array  # [D, F]
    w_up: jax.Array  # [D, F]
    w_down: jax.Array  # [F, D]
    mlp_gate: jax.Array  # [1]


def cross_keys_values(lw: CrossLayer, states: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
    """The layer's keys (k-normed) and values [F, KV, K] of one image's vision states [F, D]."""
    keys = rms_norm(jnp.einsum("fd,dhk->fhk", states, lw.wk), lw.k_norm, eps)
    return keys, jnp.einsum("fd,dhk->fhk", states, lw.wv)


def visible_states(positions: jax.Array, image_offset: int, used: int, frames: int) -> tuple[jax.Array, jax.Array]:
    """([T] states each token at `positions` sees, [T] whether its MLP output counts) for a prompt whose `<|image|>`
    token is at `image_offset`, the image's first `used` of `frames` states its used tiles'."""
    after = positions >= image_offset
    return jnp.where(after, used, frames), after


def cross_layer(lw: CrossLayer, x: jax.Array, keys: jax.Array, values: jax.Array, visible: jax.Array,
                row_on: jax.Array, eps: float, activation: str = "silu") -> jax.Array:
    """x [T, D] through the layer attending keys / values [F, KV, K]: token t the first visible[t] of them, its MLP
    output kept where row_on[t]."""
    h = rms_norm(x, lw.attn_norm, eps)
    q = rms_norm(jnp.einsum("td,dhk->thk", h, lw.wq), lw.q_norm, eps)
    group = q.shape[1] // keys.shape[1]
    k, v = jnp.repeat(keys, group, axis=1), jnp.repeat(values, group, axis=1)
    scores = jnp.einsum("thk,fhk->htf", q, k) * q.shape[-1] ** -0.5
    seen = jnp.arange(keys.shape[0])[None, :] < visible[:, None]  # [T, F]
    weights = jax.nn.softmax(jnp.where(seen[None], scores, -jnp.inf), axis=-1)
    attn = jnp.einsum("htf,fhk->thk", weights, v)
    x = x + jnp.tanh(lw.attn_gate) * jnp.einsum("thk,hkd->td", attn, lw.wo)
    out = gated_mlp(rms_norm(x, lw.mlp_norm, eps), lw.w_gate, lw.w_up, lw.w_down, activation)
    return x + jnp.tanh(lw.mlp_gate) * jnp.where(row_on[:, None], out, 0)
