"""Speculative acceptance rates from raw counts (host side, NumPy only, no jax).

The engine's host bookkeeping summarizes a request's verify-step counts and keeps running totals
here without importing jax.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# `stats.SpecCounters`' fields, in order: what the device loop counts per sequence.
COUNTER_FIELDS = ("drafted", "accepted", "drafted_at", "accepted_at", "spec_passes", "target_passes", "emitted")


def summarize(totals: dict[str, Any]) -> dict[str, Any]:
    """Rates from raw counts: acceptance rate, mean accepted length (tokens per verify pass)."""
    drafted, accepted = int(totals["drafted"]), int(totals["accepted"])
    spec_passes, target_passes = int(totals["spec_passes"]), int(totals["target_passes"])
    drafted_at = np.asarray(totals["drafted_at"])
    accepted_at = np.asarray(totals["accepted_at"])
    per_position = np.where(drafted_at > 0, accepted_at / np.maximum(drafted_at, 1), np.nan)
    return {
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        # accepted drafts plus the correction/bonus token, per verifying target pass
        "mean_accepted_length": (accepted + spec_passes) / spec_passes if spec_passes else 0.0,
        "acceptance_per_position": [None if np.isnan(x) else float(x) for x in per_position],
        "spec_passes": spec_passes,
        "target_passes": target_passes,
        "tokens_per_target_pass": int(totals["emitted"]) / target_passes if target_passes else 0.0,
    }



def request_stats(counters: dict[str, np.ndarray], row: int) -> dict[str, Any]:
    """Summary of one sequence from host copies of the counters."""
    return summarize({name: counters[name][row] for name in COUNTER_FIELDS})


class SpecMetrics:
    """Running totals over every speculative call of one LLM (host side)."""

    def __init__(self, k: int):
        self._totals: dict[str, Any] = {name: 0 for name in COUNTER_FIELDS}
        self._totals["drafted_at"] = np.zeros(k, np.int64)
        self._totals["accepted_at"] = np.zeros(k, np.int64)
        self.requests = 0

    def add(self, counters: dict[str, np.ndarray], rows: int) -> None:
        """Add the first `rows` sequences of one verify step (the rest are batch padding)."""
        for name in COUNTER_FIELDS:
            self._totals[name] = self._totals[name] + counters[name][:rows].sum(axis=0)

    def count_request(self) -> None:
        """One more request finished on a speculating engine (`requests` in the totals)."""
        self.requests += 1

    def totals(self) -> dict[str, Any]:
        """Totals since load, with rates."""
        return {"requests": self.requests, **summarize(self._totals)}
