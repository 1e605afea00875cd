"""Per-token rows a layer keeps in its K pages and reads back at earlier positions of the same sequence (Qwen4-Exp:
its PLE layers' token ids and conv inputs, its QSA layers' keys, values and index keys).

A row is one [W] vector per token, written as the layer's one K head (its V head gets zeros of the same width: the
cache keeps keys and values one width); reads go through `sparse_latent_attention.CachedRows`, one gather over a
contiguous cache, a paged one or an engine step's ragged view, so the same code runs whole sequences and engine
steps (chunked prefill, decode), and preemption recomputes the rows with the tokens. Token ids are stored as three
base-256 digits, exact in any float dtype the cache holds (bfloat16 too).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.models.sparse_latent_attention import CachedRows, cached_rows

DIGITS = 3  # base-256 digits of a token id (ids below 2**24)


def write_rows(cache: Any, layer: int, rows: jax.Array, positions: jax.Array) -> Any:
    """cache with rows [B, T, W] written as `layer`'s K at positions [B, T] (V zeros)."""
    k = rows[:, :, None, :]
    return cache.write(layer, k, jnp.zeros_like(k), positions)


def layer_rows(cache: Any, layer: int, batch: int, steps: int) -> CachedRows:
    """`layer`'s rows as the step's B * T tokens read them (flattened in order)."""
    return cached_rows(cache, layer, batch, steps)


def read_back(rows: CachedRows, positions: jax.Array, lo: int, hi: int) -> jax.Array:
    """Columns lo:hi of the rows at positions [N, s] of each token's sequence: [N, s, hi - lo] (positions before the
    sequence read position 0's: mask them)."""
    return rows.gather(rows.token_rows, positions, lo, hi)


def token_digits(tokens: jax.Array, dtype: Any) -> jax.Array:
    """tokens [...] -> [..., DIGITS] base-256 digits, low first, in `dtype`."""
    shifts = jnp.arange(DIGITS, dtype=jnp.int32) * 8
    return ((jnp.maximum(tokens, 0)[..., None] >> shifts) & 255).astype(dtype)


def digits_token(digits: jax.Array) -> jax.Array:
    """[..., DIGITS] digits -> token ids [...] int32."""
    values = jnp.round(digits.astype(jnp.float32)).astype(jnp.int32)
    return jnp.sum(values << (jnp.arange(DIGITS, dtype=jnp.int32) * 8), axis=-1)
