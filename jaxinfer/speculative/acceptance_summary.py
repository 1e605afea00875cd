"""Speculative acceptance rates from raw counts (host side, NumPy only, no jax).

Kept apart from `speculative.stats` (whose counters live on device) so that the engine's host
bookkeeping can summarize a request's counts without importing jax.
"""

from __future__ import annotations

from typing import Any

import numpy as np


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
