"""Quality metrics of B against A: pure functions of token ids and log-probabilities (NumPy only).

They hold no state and load nothing, so the server's shadow validation can score each shadowed
request with the same functions the offline `jaxinfer compare` uses.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class GreedyAgreement:
    """How far B's greedy outputs follow A's, over prompts of equal requested length."""

    exact_match: float  # fraction of prompts whose whole outputs are equal
    position_match: float  # mean over prompts of the fraction of positions holding the same token
    first_divergence: list[int]  # per prompt: the first differing position (the length when none)
    agreement_by_position: list[float]  # [t]: fraction of prompts still identical through position t


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    """The first position where the two sequences differ (a length difference counts); the length if none."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def greedy_agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> GreedyAgreement:
    """Exact-match rate, per-position match and agreement until first divergence of paired outputs."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same non-zero number of outputs from A and B, got {len(a)} and {len(b)}")
    length = max(max(len(x), len(y)) for x, y in zip(a, b))
    diverge = [first_divergence(x, y) for x, y in zip(a, b)]
    same = [x == y for x, y in zip(map(list, a), map(list, b))]
    matches = [_position_match(x, y) for x, y in zip(a, b)]
    by_position = [float(np.mean([d > t for d in diverge])) for t in range(length)]
    return GreedyAgreement(float(np.mean(same)), float(np.mean(matches)), diverge, by_position)


def _position_match(a: Sequence[int], b: Sequence[int]) -> float:
    """Fraction of positions (of the longer output) where both hold the same token."""
    n, longest = min(len(a), len(b)), max(len(a), len(b))
    if longest == 0:
        return 1.0
    return float(np.sum(np.asarray(a[:n]) == np.asarray(b[:n])) / longest)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Float32 log-probabilities along the last axis, computed in float64 for small KLs."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return x.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class TeacherForced:
    """Per next-token prediction over texts both sides read token by token (positions concatenated)."""

    top1_agree: np.ndarray  # [P] bool: both argmaxes equal
    kl: np.ndarray  # [P] KL(A || B) in nats
    nll_a: np.ndarray  # [P] -log p_A(actual next token)
    nll_b: np.ndarray  # [P]

    def summary(self) -> dict[str, float]:
        """Top-1 agreement, KL mean/p99/max and each side's perplexity on these texts."""
        if not self.kl.size:
            return {"positions": 0}
        ppl_a, ppl_b = perplexity(self.nll_a), perplexity(self.nll_b)
        return {
            "positions": int(self.kl.size), "top1_agreement": float(self.top1_agree.mean()),
            "kl_mean": float(self.kl.mean()), "kl_p99": float(np.percentile(self.kl, 99)), "kl_max": float(self.kl.max()),
            "perplexity_a": ppl_a, "perplexity_b": ppl_b, "perplexity_increase": ppl_b / ppl_a - 1,
        }


def teacher_forced(logp_a: np.ndarray, logp_b: np.ndarray, ids: Sequence[int]) -> TeacherForced:
    """Compare next-token log-probabilities [T, V] of one text ids [T] (the last position predicts nothing)."""
    if logp_a.shape != logp_b.shape or logp_a.shape[0] != len(ids):
        raise ValueError(f"log-probabilities {logp_a.shape} and {logp_b.shape} do not both cover {len(ids)} tokens")
    a, b, nxt = logp_a[:-1], logp_b[:-1], np.asarray(ids[1:])
    kl = np.maximum((np.exp(a.astype(np.float64)) * (a - b)).sum(axis=-1), 0.0)  # rounding can dip below 0
    rows = np.arange(len(nxt))
    return TeacherForced(a.argmax(-1) == b.argmax(-1), kl, -a[rows, nxt].astype(np.float64),
                         -b[rows, nxt].astype(np.float64))


def concat(parts: Sequence[TeacherForced]) -> TeacherForced:
    """The positions of several texts as one."""
    fields = [f.name for f in dataclasses.fields(TeacherForced)]
    if not parts:
        return TeacherForced(*(np.zeros(0) for _ in fields))
    return TeacherForced(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))


def perplexity(nll: np.ndarray) -> float:
    """exp of the mean negative log-likelihood."""
    return float(np.exp(np.mean(nll)))
