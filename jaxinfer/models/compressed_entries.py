"""DeepSeek-V4's compressed entries (transformers' DeepseekV4HCACompressor, DeepseekV4CSACompressor and the CSA
indexer's own compressor) as pure functions over a layer's token rows.

Each token projects its normed input to a value C and a gate Z (c * width each). The entry of block w (tokens
w*m .. w*m + m - 1) is, per dim, the softmax over slots of Z + B (B: the learned `position_bias` [m, c * width] by
slot) weighing C, then RMS-normed and rotated at position w*m by the compressed layers' rope:
- HCA (c = 1): the slots are block w's m tokens;
- CSA (c = 2, overlapping windows): the slots are block w - 1's tokens through their first half (Ca) and block w's
  through their second (Cb); block 0 has no block before it (those slots weigh nothing).

An entry is complete once its block's last token is: it is computed then, from the raw C and Z of the 2m (or m)
tokens before it read back from the pages, and stored in that last token's row (models/deepseek_v4_attention), so
a chunk or a decode step that completes a block started in an earlier step pools it from the stored rows, and
later queries read each entry from one row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.models.blocked_attention import NEG_INF
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, apply_rope


def rotate_last(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, heads, K] with its last cos.shape[-1] dims rotated in adjacent pairs (DeepSeek-V4's [nope | rope]
    layout); cos, sin [B, T, dims] as `rope.cos_sin` gives them."""
    dims = cos.shape[-1]
    rotated = apply_rope(x[..., -dims:], cos, sin, interleaved=True)
    return jnp.concatenate([x[..., :-dims], rotated], axis=-1)


def pooled_entry(values: jax.Array, gates: jax.Array, bias: jax.Array, first: jax.Array, overlap: bool) -> jax.Array:
    """The entry [N, W] of each token's block from the raw values and gates of the slots before it, itself last
    ([N, c*m, c*W]: c = 2 with `overlap`, 1 without); bias [m, c*W]; first [N] the position of the first slot
    (slots before position 0 weigh nothing). Float32."""
    rate = bias.shape[0]
    width = values.shape[-1] // (2 if overlap else 1)
    values, gates = values.astype(jnp.float32), gates.astype(jnp.float32)
    if overlap:  # block w - 1's Ca (first half), then block w's Cb (second half)
        values = jnp.concatenate([values[:, :rate, :width], values[:, rate:, width:]], axis=1)
        gates = jnp.concatenate([gates[:, :rate, :width] + bias[:, :width], gates[:, rate:, width:] + bias[:, width:]],
                                axis=1)
    else:
        gates = gates + bias
    slots = first[:, None] + jnp.arange(values.shape[1])
    gates = jnp.where((slots >= 0)[:, :, None], gates, NEG_INF)
    return jnp.sum(values * jax.nn.softmax(gates, axis=1), axis=1)


def block_entries(
    values: jax.Array, gates: jax.Array, bias: jax.Array, norm: jax.Array, positions: jax.Array, rope: CosSin,
    overlap: bool, eps: float,
) -> jax.Array:
    """Each token's block entry [N, W] (meaningful where the token ends its block: position + 1 a multiple of m),
    normed and rotated at the block's first position (rope: the tables at those positions [1, N, dims])."""
    rate = bias.shape[0]
    first = positions - (2 if overlap else 1) * rate + 1
    entry = rms_norm(pooled_entry(values, gates, bias, first, overlap), norm, eps)
    return rotate_last(entry[None, :, None], *rope)[0, :, 0]
