"""Acceptance counters: per-sequence arrays on device, per-request and running totals on host."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.speculative.acceptance_summary import summarize


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


FIELDS = [f.name for f in dataclasses.fields(SpecCounters)]


def request_stats(counters: dict[str, np.ndarray], row: int) -> dict[str, Any]:
    """Summary of one sequence from host copies of the counters."""
    return summarize({name: counters[name][row] for name in FIELDS})


class SpecMetrics:
    """Running totals over every speculative call of one LLM (host side)."""

    def __init__(self, k: int):
        self._totals: dict[str, Any] = {name: 0 for name in FIELDS}
        self._totals["drafted_at"] = np.zeros(k, np.int64)
        self._totals["accepted_at"] = np.zeros(k, np.int64)
        self.requests = 0

    def add(self, counters: dict[str, np.ndarray], rows: int) -> None:
        """Add the first `rows` sequences of one call (the rest are batch padding)."""
        for name in FIELDS:
            self._totals[name] = self._totals[name] + counters[name][:rows].sum(axis=0)
        self.requests += rows

    def totals(self) -> dict[str, Any]:
        """Totals since load, with rates."""
        return {"requests": self.requests, **summarize(self._totals)}
