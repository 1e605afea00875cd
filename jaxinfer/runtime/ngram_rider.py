"""Prompt lookup on the device, inside the engine's verify step (`method="ngram_device"`).

The host's n-gram lookup (`engine/ngram_lookup.ngram_draft`) needs the tokens a call produced,
so a host-drafted verify call runs one round and every round pays a call's fixed cost (on a GPU
~2 ms, as much as a 1B model's decode step). Here a pool holds every position's token, indexed
by the target's page tables like the K/V (same page ids: prefix sharing, preemption and
recompute hold for it), and each verify round looks up its drafts from it, so one call runs
several rounds as a draft model's does. Every step stores the tokens it feeds (prefill chunks,
decode steps, verified chunks); a position is read only once its token is stored, and the
last token of a row, sampled but not fed yet, joins its history for the lookup.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from jaxinfer.runtime.position_pool import store_at

if TYPE_CHECKING:
    from jaxinfer.runtime.engine_step import StepInputs


@dataclasses.dataclass(frozen=True)
class NgramLookup:
    """The lookup's n-gram sizes (static: each is a compare pass over a row's history)."""

    ngram_min: int
    ngram_max: int


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class NgramDraft:
    """The token pool [pages, page_size] int32 and the lookup it serves."""

    tokens: jax.Array
    lookup: NgramLookup = dataclasses.field(metadata=dict(static=True))


def store(draft: NgramDraft, x: "StepInputs") -> NgramDraft:
    """The pool with x's flat tokens stored at their positions (padding, position -1, writes nothing)."""
    pool = store_at(draft.tokens, x.page_table[x.token_rows], x.positions, x.tokens)
    return dataclasses.replace(draft, tokens=pool)


def latest_match(history: jax.Array, last: jax.Array, wanted: jax.Array, lookup: NgramLookup) -> jax.Array:
    """Per row, where the latest earlier occurrence of its last n tokens ends (n = ngram_max down to
    ngram_min: the longest that occurs), preferring one with `wanted` tokens after it; -1 for none.

    history [R, S]: each row's tokens by position, valid up to last [R] (its last token's position).
    The rule of the host's `ngram_draft`, so both propose alike.
    """
    positions = jnp.arange(history.shape[1], dtype=jnp.int32)[None, :]
    last_, wanted_ = last[:, None], wanted[:, None]
    chosen = jnp.full(last.shape, -1, jnp.int32)
    for n in range(lookup.ngram_max, lookup.ngram_min - 1, -1):
        match = (positions >= n - 1) & (positions <= last_ - 1) & (last_ >= n)
        for j in range(n):  # history[end - j] == history[last - j]
            tail = jnp.take_along_axis(history, jnp.maximum(last_ - j, 0), axis=1)
            match &= jnp.roll(history, j, axis=1) == tail
        full = jnp.max(jnp.where(match & (positions <= last_ - wanted_), positions, -1), axis=1)
        latest = jnp.max(jnp.where(match, positions, -1), axis=1)
        chosen = jnp.where(chosen < 0, jnp.where(full >= 0, full, latest), chosen)
    return chosen


def propose(draft: NgramDraft, x: "StepInputs", count: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(drafts [R, C-1], how many each row found [R], <= count): what followed the latest earlier
    occurrence of the row's last tokens in its history.

    x is the verify layout (every row one chunk of C tokens starting with its last token).
    """
    rows = x.lengths.shape[0]
    chunk = x.tokens.shape[0] // rows
    last = x.lengths - x.query_lens  # the position of each row's last token, not stored yet
    history = draft.tokens[x.page_table].reshape(rows, -1)
    history = history.at[jnp.arange(rows), jnp.clip(last, 0, history.shape[1] - 1)].set(x.tokens[::chunk])
    end = latest_match(history, last, count, draft.lookup)
    found = jnp.where((x.query_lens > 0) & (end >= 0), jnp.clip(jnp.minimum(count, last - end), 0), 0)
    columns = jnp.arange(chunk - 1, dtype=jnp.int32)[None, :]
    index = jnp.clip(end[:, None] + 1 + columns, 0, history.shape[1] - 1)
    tokens = jnp.where(columns < found[:, None], jnp.take_along_axis(history, index, axis=1), 0)
    return tokens, found
