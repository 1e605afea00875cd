"""Per-token rows a layer keeps in its pages and reads back at earlier positions of the same sequence (Qwen4-Exp:
its PLE layers' token ids and conv inputs, its QSA layers' keys, values and raw index keys).

A row is one [W] vector per token, cut in two halves written as the layer's one K head and one V head (the cache
keeps keys and values one width: ceil(W / 2), the last half zero-padded); reads go through
`sparse_latent_attention.CachedRows` over each half, one gather over a contiguous cache, a paged one or an engine
step's ragged view, so the same code runs whole sequences and engine steps (chunked prefill, decode), and
preemption recomputes the rows with the tokens. Token ids are stored as three base-256 digits, exact in any float
dtype the cache holds (bfloat16 too).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.cache.contiguous import KVCache
from jaxinfer.cache.ragged_view import RaggedPagedCache
from jaxinfer.models.sparse_latent_attention import CachedRows, cached_rows

DIGITS = 3  # base-256 digits of a token id (ids below 2**24)


def half_width(width: int) -> int:
    """The K (and V) head width holding a row of `width`."""
    return -(-width // 2)


def write_rows(cache: Any, layer: int, rows: jax.Array, positions: jax.Array) -> Any:
    """cache with rows [B, T, W] written as `layer`'s K (the first half) and V (the rest) at positions [B, T]."""
    half = half_width(rows.shape[-1])
    k = rows[:, :, None, :half]
    v = jnp.pad(rows[:, :, None, half:], ((0, 0), (0, 0), (0, 0), (0, 2 * half - rows.shape[-1])))
    return cache.write(layer, k, v, positions)


@dataclasses.dataclass(frozen=True)
class TokenRows:
    """A layer's rows as the step's tokens read them: the K half and the V half."""

    keys: CachedRows
    values: CachedRows
    width: int  # W: the row's values (the V half's padding past them)

    @property
    def token_rows(self) -> jax.Array:
        """[N] each flat token's sequence row."""
        return self.keys.token_rows

    @property
    def capacity(self) -> int:
        """Positions a sequence's pages address."""
        return self.keys.capacity

    def gather(self, token_rows: jax.Array, positions: jax.Array, lo: int, hi: int) -> jax.Array:
        """Columns lo:hi of the rows at positions [n, s] of tokens' sequences [n]: [n, s, hi - lo] (positions
        before a sequence read its position 0's: mask them)."""
        half = self.keys.pool.shape[-1]
        parts = []
        if lo < half:
            parts.append(self.keys.gather(token_rows, positions, lo, min(hi, half)))
        if hi > half:
            parts.append(self.values.gather(token_rows, positions, max(lo, half) - half, hi - half))
        return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)


def layer_rows(cache: Any, layer: int, batch: int, steps: int, width: int) -> TokenRows:
    """`layer`'s rows of `width` as the step's B * T tokens read them (flattened in order)."""
    keys = cached_rows(cache, layer, batch, steps)
    if isinstance(cache, KVCache):  # its V is stored [B, KV, K, S]: the sequence's positions last
        pool = jnp.swapaxes(cache.v[layer][:, 0], 1, 2)
    else:
        pool = (cache.pages if isinstance(cache, RaggedPagedCache) else cache).v_pages[layer][0]
    return TokenRows(keys, dataclasses.replace(keys, pool=pool), width)


def read_back(rows: TokenRows, positions: jax.Array, lo: int, hi: int) -> jax.Array:
    """Columns lo:hi of the rows at positions [N, s] of each flat token's sequence: [N, s, hi - lo]."""
    return rows.gather(rows.token_rows, positions, lo, hi)


def token_digits(tokens: jax.Array, dtype: Any) -> jax.Array:
    """tokens [...] -> [..., DIGITS] base-256 digits, low first, in `dtype`."""
    shifts = jnp.arange(DIGITS, dtype=jnp.int32) * 8
    return ((jnp.maximum(tokens, 0)[..., None] >> shifts) & 255).astype(dtype)


def digits_token(digits: jax.Array) -> jax.Array:
    """[..., DIGITS] digits -> token ids [...] int32."""
    values = jnp.round(digits.astype(jnp.float32)).astype(jnp.int32)
    return jnp.sum(values << (jnp.arange(DIGITS, dtype=jnp.int32) * 8), axis=-1)
