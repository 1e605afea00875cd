"""Acceptance counters: per-sequence arrays on device (the host totals are `acceptance_summary`'s)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SpecCounters:
    """What the speculative loop did for each sequence (all int32)."""

    drafted: jax.Array  # [B] draft tokens verified (sum of each round's effective k)
    accepted: jax.Array  # [B] draft tokens the target accepted
    drafted_at: jax.Array  # [B, K] rounds in which draft position i was verified
    accepted_at: jax.Array  # [B, K] rounds in which draft position i was accepted
    spec_passes: jax.Array  # [B] target passes that verified at least one draft
    target_passes: jax.Array  # [B] all target passes (speculative or plain) while running
    emitted: jax.Array  # [B] tokens appended by the loop (the prefill token not included)


def zero_counters(batch: int, k: int) -> SpecCounters:
    """All-zero counters for a batch and k_max."""
    row, per_pos = jnp.zeros((batch,), jnp.int32), jnp.zeros((batch, k), jnp.int32)
    return SpecCounters(row, row, per_pos, per_pos, row, row, row)

