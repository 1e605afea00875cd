"""Speculation's counters on the host (no jax): a verify step's per-row counts, a request's running
totals and moving acceptance, and what `LLM.metrics()` and the server report."""

from __future__ import annotations

import numpy as np

from jaxinfer.speculative.acceptance_summary import SpecMetrics
from jaxinfer.speculative.config import SpeculativeConfig


def speculation_metrics(
    config: SpeculativeConfig, speculating: bool, fallback_reason: str | None, totals: SpecMetrics
) -> dict:
    """What `LLM.metrics()` and the server report of speculation: on or off, why not, and the totals."""
    return {"speculative": speculating, "method": config.method,
            "num_speculative_tokens": config.num_speculative_tokens, "fallback_reason": fallback_reason,
            **totals.totals()}


def moving_average(average: float | None, rate: float, decay: float) -> float:
    """A moving average with one more outcome; the first replaces the initial guess (as in the on-device loop)."""
    return rate if average is None else decay * average + (1 - decay) * rate


def zero_counts(k_max: int) -> dict:
    """A request's counters before its first verify step."""
    per_position = np.zeros(k_max, np.int64)
    return {"drafted": 0, "accepted": 0, "drafted_at": per_position, "accepted_at": per_position,
            "spec_passes": 0, "target_passes": 0, "emitted": 0}


def step_counters(drafted: np.ndarray, accepted: np.ndarray, k_max: int) -> dict[str, np.ndarray]:
    """One verify step's per-row counters, in the layout of acceptance_summary.COUNTER_FIELDS."""
    position = np.arange(k_max)[None, :]
    emitted = accepted + 1
    return {
        "drafted": drafted,
        "accepted": accepted,
        "drafted_at": (position < drafted[:, None]).astype(np.int64),
        "accepted_at": (position < accepted[:, None]).astype(np.int64),
        "spec_passes": (drafted > 0).astype(np.int64),
        "target_passes": np.ones_like(drafted),
        "emitted": emitted,
    }
