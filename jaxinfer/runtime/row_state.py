"""What the device keeps per row slot between engine steps (vLLM's persistent input batch): each
slot's page table, the sampling state of the slots whose requests need it, and where its last
multi-step decode or verify call left it (the decode carry).

Every request in a step holds a row slot (runtime/row_slots); a step ships each row's slot and
the page-table entries added since the last step (runtime/page_table_diffs), and the program
reads the rest here. Slot 0 is the padding rows': its table is never written and it holds no
sampling state.

The decode carry (last token, length, done) lets the engine start a multi-step decode or verify
call before the one ahead of it has landed (asynchronous scheduling): the new call's rows read
their token and length here (runtime/verify_carry for verify calls), so the host needs neither
the tokens the earlier call is still making nor to wait for them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.parallel.sharding import Layout
from jaxinfer.sampling.slot_state import SlotState


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RowState:
    """Per row slot: page table [S, W] int32; sampling state (penalty counts, logit bias); decode carry."""

    page_tables: jax.Array
    sampling: SlotState
    last_tokens: jax.Array  # [S] int32 the last token a multi-step decode or verify call made for the slot
    lengths: jax.Array  # [S] int32 the slot's tokens once that token is written (its position + 1)
    done: jax.Array  # [S] bool the call finished the slot's request (a stop id, max_tokens)


def with_page_entries(state: RowState, entries: jax.Array) -> RowState:
    """state with (slot, column, page) entries [D, 3] written (out-of-range slots are padding)."""
    tables = state.page_tables.at[entries[:, 0], entries[:, 1]].set(entries[:, 2], mode="drop")
    return dataclasses.replace(state, page_tables=tables)


def carried_rows(
    state: RowState, slots: jax.Array, carried: jax.Array, tokens: jax.Array, positions: jax.Array,
    lengths: jax.Array, query_lens: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(tokens, positions, lengths, query_lens) [R] of one-token decode rows, the carried ones [R]
    read from their slots' decode carry: a finished one becomes padding (no token, position -1)."""
    lengths = jnp.where(carried, state.lengths[slots], lengths)
    done = carried & state.done[slots]
    tokens = jnp.where(carried, state.last_tokens[slots], tokens)
    query_lens = jnp.where(done, 0, query_lens)
    positions = jnp.where(carried, jnp.where(done, -1, lengths - 1), positions)
    return tokens, positions, lengths, query_lens


def with_carry(state: RowState, slots: jax.Array, tokens: jax.Array, lengths: jax.Array, done: jax.Array) -> RowState:
    """state with the rows' decode carry [R] written to their slots (padding rows' slot 0 is never read)."""
    return dataclasses.replace(
        state, last_tokens=state.last_tokens.at[slots].set(tokens), lengths=state.lengths.at[slots].set(lengths),
        done=state.done.at[slots].set(done),
    )


def row_tables(state: RowState, slots: jax.Array, counts: jax.Array) -> jax.Array:
    """[R, W] each row's page table: its slot's first counts[r] entries, then page 0 (reserved), as a
    fresh table would hold: what a slot's earlier holder left there is never read or written."""
    tables = state.page_tables[slots]
    held = jnp.arange(tables.shape[1], dtype=jnp.int32)[None, :] < counts[:, None]
    return jnp.where(held, tables, 0)


def replicated(state: RowState, layout: Layout) -> RowState:
    """state pinned to every device of the mesh, inside a traced step: left to itself, XLA may hand
    back the penalty counts split over the vocabulary as the tp-sharded logits are, and the next
    call would then get a state of another sharding than it was compiled for."""
    return jax.tree.map(layout.replicated, state)
