"""Hyper-connections' settings, as a config holds them (`ModelConfig.hyper_connections`; models/hyper_connections).

A model with hyper-connections keeps `mult` residual streams per token instead of one. HY-V4 (iHC) mixes nothing
between them: each sublayer adds its output to every stream by a learned gate. DeepSeek-V4 and GLM-5.3 (mHC) also
mix the streams by a doubly-stochastic matrix (`sinkhorn_iters` rounds of Sinkhorn-Knopp), and GLM-5.3's head
averages the streams where the others weigh them by a learned gate.
"""

from __future__ import annotations

import dataclasses

HEADS = ("gated", "mean")  # how the last layer collapses the streams: a learned gate (HY-V4, DeepSeek-V4), the mean


@dataclasses.dataclass(frozen=True)
class HyperConnections:
    """The streams and their gates' constants (HF names in comments)."""

    mult: int  # hc_mult: residual streams per token
    eps: float  # hc_eps: added to the read gates (and the write gates where post_eps)
    norm_eps: float  # rms_norm_eps: the unweighted RMS norm of the flattened streams the gates are computed from
    post_scale: float = 2.0  # hc_magnitude: the write gate is post_scale * sigmoid(...) (DeepSeek-V4: 2)
    post_eps: bool = True  # HY-V4 adds eps to the write gate too; DeepSeek-V4 and GLM-5.3 do not
    sinkhorn_iters: int = 0  # hc_sinkhorn_iters: rounds of the streams' mixing matrix; 0: no mixing (HY-V4)
    head: str = "gated"  # one of HEADS

    def __post_init__(self) -> None:
        if self.mult < 1 or self.head not in HEADS:
            raise ValueError(f"hyper-connections need hc_mult >= 1 (got {self.mult}) and a head in {HEADS} "
                             f"(got {self.head!r})")
