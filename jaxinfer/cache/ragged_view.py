"""The paged KV cache as one engine step sees it: a flat token stream over per-row page tables.

A step's tokens are laid out flat, `[num_decode decode tokens][prefill rows x chunk]`, so
every projection runs once over all of them. Attention splits them again: the decode tokens
through the paged decode kernel, the prefill chunks (right-padded to one length) through the
ragged kernel. Padding tokens have position -1: their K/V writes are dropped.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.parallel.sharding import Layout


@dataclasses.dataclass
class RaggedPagedCache:
    """Page pools plus this step's rows: pages.page_table is [rows, pages_per_row]."""

    pages: PagedKVCache
    token_rows: jax.Array  # [N] int32 row of each flat token
    lengths: jax.Array  # [R] int32 tokens of each row once this step's are written
    query_lens: jax.Array  # [R] int32 this step's tokens per row (0 for padding rows)
    num_decode: int = 0  # static: the first num_decode rows (and tokens) are single-token decodes

    @property
    def layout(self) -> Layout:
        """The pools' layout (the model lays its activations out by it)."""
        return self.pages.layout

    @property
    def num_prefill(self) -> int:
        """Rows after the decode rows."""
        return self.lengths.shape[0] - self.num_decode

    def write(self, layer: int, k: jax.Array, v: jax.Array, positions: jax.Array) -> "RaggedPagedCache":
        """Store k/v [1, N, KV, K] at positions [1, N] in each token's row's pages."""
        per_token = dataclasses.replace(self.pages, page_table=self.pages.page_table[self.token_rows])
        written = per_token.write(layer, k[0][:, None], v[0][:, None], positions[0][:, None])
        pages = dataclasses.replace(written, page_table=self.pages.page_table)
        return dataclasses.replace(self, pages=pages)


jax.tree_util.register_dataclass(
    RaggedPagedCache,
    data_fields=["pages", "token_rows", "lengths", "query_lens"],
    meta_fields=["num_decode"],
)


def split_attend(q: jax.Array, cache: RaggedPagedCache, attend_rows) -> jax.Array:
    """q [1, N, H, K] -> [1, N, H, K]: decode tokens and prefill chunks through `attend_rows`.

    attend_rows(q [rows, T, H, K], lengths, page_table, query_lens) runs one group.
    """
    d, n = cache.num_decode, q.shape[1]
    table, parts = cache.pages.page_table, []
    if d:
        parts.append(attend_rows(q[0, :d][:, None], cache.lengths[:d], table[:d], cache.query_lens[:d])[:, 0])
    rows = cache.num_prefill
    if rows:
        chunk = (n - d) // rows
        grouped = q[0, d:].reshape(rows, chunk, *q.shape[2:])
        out = attend_rows(grouped, cache.lengths[d:], table[d:], cache.query_lens[d:])
        parts.append(out.reshape(rows * chunk, *q.shape[2:]))
    return jnp.concatenate(parts, axis=0)[None] if len(parts) > 1 else parts[0][None]
