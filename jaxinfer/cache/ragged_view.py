"""The paged KV cache as one engine step sees it: a flat token stream over per-row page tables.

A step's tokens are packed end to end (each row's contiguous, padding at position -1), so
every projection runs once over all of them. Attention needs no row layout: each token attends
to its own row's pages up to its own position, a paged decode over `page_table[token_rows]`
with `positions + 1` keys (`token_tables`). Its FLOPs are those of causal attention; the K/V a
row's tokens share are re-read, from caches (a GPU's L2 holds a small model's layer for a few
hundred positions). A kernel that attends a block of one row's queries at once (TPU ragged
paged attention's query blocks) would read them once: a later optimisation. Padding tokens'
K/V writes are dropped and their attention outputs never read.
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
    token_rows: jax.Array  # [T] int32 row of each flat token
    # [T] int32: keys before it are visible past the token's own position (Gemma 3's image tokens see their
    # whole image; 0 elsewhere); None (text-only models) leaves their programs as they were
    key_ends: jax.Array | None = None
    # [T] int32 the row slot of each flat token (its row's): where a Mamba2 layer's state for it lives
    # (cache/state_pool); None for attention-only models
    token_slots: jax.Array | None = None

    @property
    def layout(self) -> Layout:
        """The pools' layout (the model lays its activations out by it)."""
        return self.pages.layout

    @property
    def batch_invariant(self) -> bool:
        """Whether the step's arithmetic must not depend on its batch (see PagedKVCache)."""
        return self.pages.batch_invariant

    def token_tables(self) -> jax.Array:
        """[T, W] int32: each token's row's page table."""
        return self.pages.page_table[self.token_rows]

    def write(self, layer: int, k: jax.Array, v: jax.Array, positions: jax.Array) -> "RaggedPagedCache":
        """Store k/v [1, T, KV, K] at positions [1, T] in each token's row's pages."""
        per_token = dataclasses.replace(self.pages, page_table=self.token_tables())
        written = per_token.write(layer, k[0][:, None], v[0][:, None], positions[0][:, None])
        pages = dataclasses.replace(written, page_table=self.pages.page_table)
        return dataclasses.replace(self, pages=pages)

    def layer_view(self, layer: int) -> "RaggedPagedCache":
        """This step's view of `layer`'s pools alone, as layer 0 (see models.layer_calls)."""
        return dataclasses.replace(self, pages=self.pages.layer_view(layer))

    def with_layer(self, layer: int, view: "RaggedPagedCache") -> "RaggedPagedCache":
        """This view with `layer`'s pools taken from a one-layer view."""
        return dataclasses.replace(self, pages=self.pages.with_layer(layer, view.pages))


jax.tree_util.register_dataclass(
    RaggedPagedCache, data_fields=["pages", "token_rows", "key_ends", "token_slots"], meta_fields=[]
)


def per_token_attend(q: jax.Array, cache: RaggedPagedCache, positions: jax.Array, attend_rows) -> jax.Array:
    """q [1, T, H, K] at positions [1, T] -> [1, T, H, K]: every token one row of `attend_rows`.

    attend_rows(q [T, 1, H, K], lengths [T], page_table [T, W], query_lens [T]) is a paged
    attention over rows; a token at position p is a row of p + 1 keys (padding: 1 key, no query).
    """
    position = positions[0]
    lengths = jnp.maximum(position + 1, 1)
    query_lens = (position >= 0).astype(jnp.int32)
    return attend_rows(q[0][:, None], lengths, cache.token_tables(), query_lens)[:, 0][None]
