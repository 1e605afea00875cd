"""Which cached keys a query sees: causal, and within a sliding window or within its attention chunk.

A sliding window (Mistral, Gemma 2) keeps the `window` positions up to the query's; a chunk (Llama 4's
`attention_chunk_size`) keeps the positions of the query's own chunk, [p - p % chunk, p], so the first
query of a chunk sees itself alone however long the context. Both come down to a first visible key per
query: every attention path masks first <= key <= position and may skip the key blocks before the
earliest first. A layer has a window or a chunk, never both (`ModelConfig` checks). A query may see keys
past its own position (Gemma 3's image tokens see their whole image): the window still starts from its
position, as HF's AND(window, OR(causal, image)) mask does; a query marked `whole` (a PaliGemma prompt token) sees
every key up to its last from the first, window aside, as HF's OR(window, prefix) mask does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def first_visible_key(positions: jax.Array, window: int, chunk: int = 0) -> jax.Array:
    """The earliest key position each query at `positions` sees (same shape; 0 with neither window nor chunk)."""
    if chunk > 0:
        return positions - positions % chunk
    if window > 0:
        return jnp.maximum(positions - window + 1, 0)
    return jnp.zeros_like(positions)


def visible_keys(
    keys: jax.Array, positions: jax.Array, window: int, chunk: int = 0, last: jax.Array | None = None,
    whole: jax.Array | None = None,
) -> jax.Array:
    """[..., T, S] bool: key position keys[s] is visible to the query at positions[..., t]; last (as positions):
    the last key each query sees when past its own position (an image token's image end, Gemma 3); whole (bool, as
    positions): queries that see every key up to their last, window aside (PaliGemma's prefix)."""
    p = positions[..., :, None]
    visible = keys <= (p if last is None else last[..., :, None])
    if window > 0 or chunk > 0:
        visible &= keys >= first_key(p, window, chunk, None if whole is None else whole[..., :, None])
    return visible


def first_key(positions: jax.Array, window: int, chunk: int = 0, whole: jax.Array | None = None) -> jax.Array:
    """first_visible_key, 0 for the queries marked `whole` (they see back to the first key)."""
    first = first_visible_key(positions, window, chunk)
    return first if whole is None else jnp.where(whole, 0, first)
