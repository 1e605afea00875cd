"""Pools of one value per token position, indexed like the K/V by the target's page tables (same page
ids, so prefix sharing, preemption and recompute hold for them): an EAGLE head's features and
outputs, the device lookup's tokens."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def pool_index(pool: jax.Array, table: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(page, slot) of positions [N] in page tables [N, P]; position -1 maps past the pool (dropped)."""
    page_size = pool.shape[1]
    page = jnp.take_along_axis(table, jnp.maximum(positions, 0)[:, None] // page_size, axis=1)[:, 0]
    return jnp.where(positions >= 0, page, pool.shape[0]), positions % page_size


def store_at(pool: jax.Array, table: jax.Array, positions: jax.Array, values: jax.Array) -> jax.Array:
    """The pool with values [N, ...] written at positions [N] (tables [N, P]); padding writes nothing."""
    page, slot = pool_index(pool, table, positions)
    return pool.at[page, slot].set(values.astype(pool.dtype), mode="drop")


@functools.partial(jax.jit, donate_argnums=0)
def store_pages(pool: jax.Array, pages: jax.Array, values: jax.Array) -> jax.Array:
    """The pool with whole pages [n] holding values [n, page_size, ...]; pages past the pool write nothing."""
    return pool.at[pages].set(values.astype(pool.dtype), mode="drop")
