"""Donated buffers: a call that donates a cache uses it up, also when the call fails."""

from __future__ import annotations

import jax


def is_consumed(tree: object) -> bool:
    """True when a donated pytree's buffers were used up by a call (e.g. one that failed)."""
    return any(x.is_deleted() for x in jax.tree.leaves(tree))
