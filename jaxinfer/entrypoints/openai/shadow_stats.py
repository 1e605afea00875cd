"""What shadow validation has seen: counters, agreement and KL histograms, the window the lossy
fallback reads, the last mismatches, and which optimizations fell back and why (plain Python)."""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Mapping

from jaxinfer.config import validation
from jaxinfer.engine.metrics import Histogram


@dataclasses.dataclass(frozen=True)
class ShadowSettings:
    """The `--shadow-*` flags: how much to shadow, against what, and when to fall back."""

    fraction: float = 0.0  # of requests shadowed, 0..1
    reference: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # --shadow-config, over REFERENCE_DEFAULTS
    min_agreement: float = 0.9  # a lossy optimization falls back below this mean agreement ...
    window: int = 16  # ... over this many recent shadowed requests
    fallback: bool = True  # False: measure only
    keep: int = 32  # mismatches /debug/shadow shows
    max_pending: int = 8  # shadow requests waiting at most; more are dropped
    seed: int | None = None  # of the sampling of requests (tests)

    def __post_init__(self) -> None:
        validation.number(self.fraction, "--shadow-fraction", 0, 1)
        validation.number(self.min_agreement, "--shadow-min-agreement", 0, 1)
        validation.positive_int(self.window, "--shadow-window")
        validation.positive_int(self.keep, "shadow keep")
        validation.positive_int(self.max_pending, "shadow max_pending")


AGREEMENT_BUCKETS = (0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.999, 1.0)
KL_BUCKETS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0)
AGREEMENT_KINDS = ("greedy", "top1")  # greedy: per-position match of outputs; top1: teacher-forced argmaxes


@dataclasses.dataclass(frozen=True)
class Score:
    """One shadowed request against the reference."""

    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]  # the served (primary) output
    reference_ids: list[int] | None  # the reference's greedy output (None: a sampled request)
    first_divergence: int | None  # greedy: first differing position; sampled: first differing argmax
    greedy_match: float | None  # greedy: fraction of positions holding the same token
    top1: float | None  # teacher forcing: fraction of output positions with the same argmax
    kl: float | None  # teacher forcing: mean KL(reference || served) per output position, nats

    @property
    def agreement(self) -> float | None:
        """What the lossy window reads: the greedy match where there is one, else top-1 agreement."""
        return self.greedy_match if self.greedy_match is not None else self.top1

    @property
    def mismatch(self) -> bool:
        """A greedy output that differs, or a teacher-forced argmax that differs somewhere."""
        if self.reference_ids is not None:
            return self.reference_ids != self.output_ids
        return self.top1 is not None and self.top1 < 1.0


class ShadowStats:
    """Thread-safe: the shadow worker writes, /metrics and /debug/shadow read."""

    def __init__(self, window: int, keep: int):
        self.lock = threading.Lock()
        self.counts = collections.Counter()  # requests, mismatches, dropped, errors
        self.agreement = {kind: Histogram(AGREEMENT_BUCKETS) for kind in AGREEMENT_KINDS}
        self.kl = Histogram(KL_BUCKETS)
        self.window: collections.deque[float] = collections.deque(maxlen=window)
        self.mismatches: collections.deque[dict] = collections.deque(maxlen=keep)

    def count(self, name: str) -> None:
        """One more of a counter (dropped, errors)."""
        with self.lock:
            self.counts[name] += 1

    def record(self, score: Score, prompt_text: str | None, decode: Any) -> float | None:
        """Fold one score in; the window's mean agreement once the window is full, else None."""
        with self.lock:
            self.counts["requests"] += 1
            if score.greedy_match is not None:
                self.agreement["greedy"].observe(score.greedy_match)
            if score.top1 is not None:
                self.agreement["top1"].observe(score.top1)
            if score.kl is not None:
                self.kl.observe(score.kl)
            if score.mismatch:
                self.counts["mismatches"] += 1
                self.mismatches.append(_mismatch_entry(score, prompt_text, decode))
            if score.agreement is not None:
                self.window.append(score.agreement)
            full = len(self.window) == self.window.maxlen
            return sum(self.window) / len(self.window) if full else None

    def snapshot(self) -> dict:
        """Counters and histogram snapshots for the metrics collector."""
        with self.lock:
            return {
                **{name: self.counts[name] for name in ("requests", "mismatches", "dropped", "errors")},
                "agreement": {kind: h.snapshot() for kind, h in self.agreement.items()},
                "kl": self.kl.snapshot(),
            }

    def last_mismatches(self) -> list[dict]:
        """The kept mismatches, newest last."""
        with self.lock:
            return list(self.mismatches)


def _mismatch_entry(score: Score, prompt_text: str | None, decode: Any) -> dict:
    """A mismatch as /debug/shadow shows it: ids, texts (when the model has a tokenizer) and where they part."""
    text = (lambda ids: None if ids is None or decode is None else decode(ids))
    return {
        "request_id": score.request_id, "prompt_token_ids": score.prompt_ids, "prompt": prompt_text,
        "output_token_ids": score.output_ids, "output": text(score.output_ids),
        "reference_token_ids": score.reference_ids, "reference_output": text(score.reference_ids),
        "first_divergence": score.first_divergence, "greedy_match": score.greedy_match, "top1_agreement": score.top1,
        "kl_mean": score.kl,
    }


@dataclasses.dataclass
class Fallback:
    """One optimization switched to the reference path."""

    optimization: str
    cause: str  # shadow_mismatch, low_agreement, error, does_not_pay, load_failed
    reason: str  # the one line that was logged


class Fallbacks:
    """Which optimizations are off and why (thread-safe); switching is one way until restart."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: dict[str, Fallback] = {}

    def switch(self, optimization: str, cause: str, reason: str) -> bool:
        """Record a fallback; False when that optimization had already fallen back."""
        with self.lock:
            if optimization in self.active:
                return False
            self.active[optimization] = Fallback(optimization, cause, reason)
            return True

    def is_active(self, optimization: str) -> bool:
        """True once the optimization fell back."""
        with self.lock:
            return optimization in self.active

    def snapshot(self) -> dict[str, Fallback]:
        """A copy of the active fallbacks."""
        with self.lock:
            return dict(self.active)
