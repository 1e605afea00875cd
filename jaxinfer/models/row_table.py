"""An embedding table kept as raw bits, so that looking rows up never widens it.

XLA:CPU has no bf16 gather: for one it converts the whole table to float32, and in a decode
loop it hoists that conversion out of the loop, so every call writes a float32 copy of the
table (113 MB for a 49k x 576 vocabulary, ~5 ms per step of a 135M model at batch 1). A
bitcast inside the program is no cure (XLA:CPU materializes it as a copy too), so the CPU
weight tree stores the table's bits once, at load, and the lookup moves integers.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RowTable:
    """A [V, D] table of `dtype` stored as same-width unsigned integers."""

    bits: jax.Array
    dtype: str = dataclasses.field(metadata={"static": True})


def as_row_table(table: jax.Array) -> RowTable:
    """The table's bits (a copy made once, outside any program)."""
    bits = jnp.dtype(f"uint{8 * table.dtype.itemsize}")
    return RowTable(jax.lax.bitcast_convert_type(table, bits), jnp.dtype(table.dtype).name)


def full_table(table: jax.Array | RowTable) -> jax.Array:
    """The table in its own dtype."""
    if isinstance(table, RowTable):
        return jax.lax.bitcast_convert_type(table.bits, jnp.dtype(table.dtype))
    return table


def take_rows(table: jax.Array | RowTable, ids: jax.Array) -> jax.Array:
    """table[ids] in the table's dtype (ids are checked on the host before they get here)."""
    if isinstance(table, RowTable):
        rows = jnp.take(table.bits, ids, axis=0, mode="clip")
        return jax.lax.bitcast_convert_type(rows, jnp.dtype(table.dtype))
    return jnp.take(table, ids, axis=0)
