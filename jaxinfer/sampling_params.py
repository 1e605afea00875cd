"""User-facing sampling parameters (host side, validated on construction)."""

from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request; defaults follow vLLM (temperature 1, no filtering).

    temperature 0 means greedy. top_k 0 (or -1) and top_p 1 disable those filters; min_p keeps
    tokens whose probability is at least min_p times the most likely one's. The same seed gives
    the same output whatever else is in the batch. Penalties follow vLLM: presence and frequency
    subtract from the logits of tokens already generated; repetition divides positive (multiplies
    negative) logits of tokens in the prompt or output. `stop` strings end generation and are
    not part of the text; `logprobs=k` returns the top-k log-probabilities of each generated
    token (and `prompt_logprobs=k` of each prompt token); `n` samples share the prompt.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | Sequence[str] = ()
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    n: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
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
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2 <= value <= 2, f"{name} must be in [-2, 2], got {value}")
        _check(
            0 < self.repetition_penalty <= 10,
            f"repetition_penalty must be in (0, 10] (1 disables it), got {self.repetition_penalty}",
        )
        _check(
            all(isinstance(s, str) and s for s in self.stop),
            f"stop must be a non-empty string or a list of them, got {self.stop!r}",
        )
        _check(
            0 <= self.min_tokens <= self.max_tokens,
            f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(value is None or 0 <= value <= 20, f"{name} must be None or in [0, 20], got {value}")
        _check(1 <= self.n <= 64, f"n must be in [1, 64], got {self.n}")

    @property
    def greedy(self) -> bool:
        """True when tokens are chosen by argmax."""
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """True when any penalty changes the logits."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
