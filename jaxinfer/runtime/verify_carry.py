"""Verify calls and the decode carry (`row_state`): a verify call leaves each row's last token, length
and whether it finished in its slot, as a multi-step decode call does, and a verify call started
before the one ahead of it landed (asynchronous scheduling) lays its carried rows' chunks out
from there. The host then needs neither the tokens the call ahead is still making nor to wait
for them, so consecutive speculative calls keep the device busy while the host applies outputs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.runtime.engine_step import StepInputs, StepOutputs
from jaxinfer.runtime.row_state import RowState, with_carry
from jaxinfer.runtime.verify_step import Drafts, next_round


def carried_verify_rows(
    state: RowState, x: StepInputs, drafts: Drafts, draft_start: jax.Array
) -> tuple[StepInputs, Drafts, jax.Array]:
    """(x, drafts, draft_start) with each carried row's chunk `[last token, count placeholders]` laid
    out where its slot's carry left it; a row the call ahead finished becomes padding.

    A carried row's draft count is cut to its max_tokens here (the host planned on tokens it did
    not have yet), and its draft model or head has nothing to catch up: the host chains a verify
    call only behind one that left its rows' drafts caught up (or for the device's lookup, which
    stores every token it is fed). Rows not carried are as the host laid them out.
    """
    rows = x.lengths.shape[0]
    chunk = x.tokens.shape[0] // rows
    carried, slots = x.carried, x.row_slots
    live = carried & ~state.done[slots]
    last_position = state.lengths[slots] - 1
    room = x.sampling.max_lengths - last_position - 2
    count = jnp.where(live, jnp.clip(jnp.minimum(drafts.count, room), 0), 0)
    laid = next_round(x, state.last_tokens[slots], last_position, count, live)
    each_token = jnp.repeat(carried, chunk)
    x = dataclasses.replace(
        x, tokens=jnp.where(each_token, laid.tokens, x.tokens),
        positions=jnp.where(each_token, laid.positions, x.positions),
        lengths=jnp.where(carried, jnp.where(live, laid.lengths, state.lengths[slots]), x.lengths),
        query_lens=jnp.where(carried, laid.query_lens, x.query_lens),
    )
    drafts = Drafts(jnp.where(carried[:, None], 0, drafts.tokens), jnp.where(carried, count, drafts.count))
    return x, drafts, jnp.where(carried, last_position, draft_start)


def with_verify_carry(state: RowState, x: StepInputs, out: StepOutputs) -> RowState:
    """state with each live row's carry after verify rounds from layout x (their first round's): its
    last emitted token, its length, and whether it finished (a stop id emitted, or max_tokens)."""
    rows = x.lengths.shape[0]
    s, slots, counts = x.sampling, x.row_slots, out.counts
    live = x.query_lens > 0
    last_token = out.tokens[jnp.arange(rows), jnp.clip(counts - 1, 0)]
    length = x.lengths - x.query_lens + 1 + counts  # the first round's last token sat at lengths - query_lens
    emitted = jnp.arange(out.tokens.shape[1], dtype=jnp.int32)[None, :] < counts[:, None]
    stopped = jnp.any(emitted[:, :, None] & (out.tokens[:, :, None] == s.stop_ids[:, None, :]), axis=(1, 2))
    done = stopped | (length >= s.max_lengths)
    return with_carry(
        state, slots, jnp.where(live, last_token, state.last_tokens[slots]),
        jnp.where(live, length, state.lengths[slots]), jnp.where(live, done, state.done[slots]),
    )
