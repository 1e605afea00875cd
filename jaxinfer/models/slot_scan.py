"""A recurrence over a step's flat tokens, each through its request's row slot in per-slot state pools.

The engine packs several requests' tokens end to end (cache/state_pool: one state per row slot). Token t reads
its slot's states, zeros at its request's position 0 (a new request, or a preempted one recomputing over a slot
another left its state in), runs one step of the recurrence and writes them back; a padding token (position -1)
writes nothing. A decode step is the same scan over one token per row.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

States = tuple[jax.Array, ...]
TokenStep = Callable[..., tuple[States, jax.Array]]  # (one slot's states, one token's inputs...) -> (states, y)


def slot_scan(
    token_step: TokenStep, pools: States, slots: jax.Array, positions: jax.Array, inputs: tuple[jax.Array, ...]
) -> tuple[States, jax.Array]:
    """The pools [S, ...] after token_step over T flat tokens (slots [T], positions [T] with -1 padding, each input
    [T, ...]) and the stacked outputs y [T, ...]."""
    num_slots = pools[0].shape[0]

    def step(pools: States, token: tuple[jax.Array, ...]) -> tuple[States, jax.Array]:
        slot, position, *xs = token
        fresh = position == 0
        states, y = token_step(tuple(jnp.where(fresh, 0.0, pool[slot]) for pool in pools), *xs)
        target = jnp.where(position >= 0, slot, num_slots)  # padding: dropped
        return tuple(pool.at[target].set(s, mode="drop") for pool, s in zip(pools, states)), y

    return jax.lax.scan(step, tuple(pools), (slots, positions, *inputs))
