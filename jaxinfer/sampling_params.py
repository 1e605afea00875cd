"""User-facing sampling parameters (host side, validated on construction)."""

from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request; defaults follow vLLM (temperature 1, no filtering).

    temperature 0 means greedy. top_k 0 (or -1) and top_p 1 disable those filters; min_p keeps
    tokens whose probability is at least min_p times the most likely one's. The same seed gives
    the same output whatever else is in the batch.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        _check(self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}")
        _check(
            self.temperature >= 0,
            f"temperature must be >= 0 (0 for greedy), got {self.temperature}",
        )
        _check(
            0 < self.top_p <= 1,
            f"top_p must be in (0, 1], got {self.top_p}; use 1.0 to disable nucleus sampling",
        )
        _check(self.top_k >= 0, f"top_k must be >= 0 (0 or -1 disables it), got {self.top_k}")
        _check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        _check(
            self.seed is None or 0 <= self.seed < 2**63,
            f"seed must be a non-negative integer below 2**63, got {self.seed}",
        )

    @property
    def greedy(self) -> bool:
        """True when tokens are chosen by argmax."""
        return self.temperature == 0


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
