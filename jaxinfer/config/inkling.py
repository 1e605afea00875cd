"""Inkling's fields beyond the shared ones (models/inkling, models/inkling_attention)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class InklingFields:
    """The relative position bias's and routing's sizes, and the full layers' logarithmic scaling (HF names)."""

    d_rel: int  # each head's relative state: the bias profiles it mixes
    rel_extent: int  # the full layers' bias reaches this many tokens back (the sliding ones': their window)
    shared_experts: int  # n_shared_experts: scored beside the routed ones, a sink in their weights' softmax
    log_scaling_n_floor: int = 0  # from this position on the full layers' q and bias scale up; 0: never
    log_scaling_alpha: float = 0.1
