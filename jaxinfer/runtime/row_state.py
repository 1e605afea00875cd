"""What the device keeps per row slot between engine steps (vLLM's persistent input batch): each
slot's page table, and the sampling state of the slots whose requests need it.

Every request in a step holds a row slot (runtime/row_slots); a step ships each row's slot and
the page-table entries added since the last step (runtime/page_table_diffs), and the program
reads the rest here. Slot 0 is the padding rows': its table is never written and it holds no
sampling state.
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
    """Per row slot: page table [S, W] int32; sampling state (penalty counts, logit bias)."""

    page_tables: jax.Array
    sampling: SlotState


def with_page_entries(state: RowState, entries: jax.Array) -> RowState:
    """state with (slot, column, page) entries [D, 3] written (out-of-range slots are padding)."""
    tables = state.page_tables.at[entries[:, 0], entries[:, 1]].set(entries[:, 2], mode="drop")
    return dataclasses.replace(state, page_tables=tables)


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
