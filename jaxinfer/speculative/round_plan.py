"""A speculative round's cost in plain decode steps and the draft length it implies (no jax).

A round always verifies k_max + 1 positions (static shapes) and drafts as many steps as the
longest plan in the batch, so its cost is round_base + steps * per_draft plain steps, with a
separate pair for all-greedy batches (no softmax or random draws) and sampled ones. The engine
plans with them on the host, in NumPy (an eager jax op per call would cost a dispatch each); its
`engine/step_costs` measures the numbers from its own steps.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from jaxinfer.speculative.config import SpeculativeConfig


class CostModel(NamedTuple):
    """Round cost in plain-step units; index 0 of each pair is for all-greedy batches, 1 for sampled.

    A NamedTuple: a pytree for jax without registering it, so this module needs no jax.
    """

    round_base: Any  # [2] float32 verify + bookkeeping, excluding draft steps
    per_draft: Any  # [2] float32 one draft step
    verify_per_row: Any  # [] float32 heuristic only: per verified token and running sequence


def heuristic_costs(draft_cost: float, spec: SpeculativeConfig) -> CostModel:
    """Verification nearly free until the pass holds verify_saturation_tokens tokens (NumPy arrays)."""
    return CostModel(
        np.ones((2,), np.float32),
        np.full((2,), draft_cost, np.float32),
        np.float32(1.0 / spec.verify_saturation_tokens),
    )


def on_host(costs: CostModel) -> CostModel:
    """The cost model as NumPy arrays, for planning on the host."""
    return CostModel(np.asarray(costs.round_base), np.asarray(costs.per_draft), np.asarray(costs.verify_per_row))


def round_cost(num_active: np.ndarray, all_greedy: bool | np.ndarray, costs: CostModel, k_max: int) -> np.ndarray:
    """Cost [k_max + 1] in plain steps of a round that drafts 0..k_max steps (verifying k_max + 1 wide)."""
    ks = np.arange(k_max + 1, dtype=np.float32)
    mode = np.where(all_greedy, 0, 1)
    verify_extra = k_max * np.minimum(costs.verify_per_row * np.asarray(num_active, np.float32), 1.0)
    return costs.round_base[mode] + verify_extra + ks * costs.per_draft[mode]


def expected_tokens(acceptance: np.ndarray, available: np.ndarray) -> np.ndarray:
    """Expected tokens [B, k_max + 1] a round drafting k steps yields, each row drafting min(k, available).

    acceptance [B, k_max] holds P(draft i accepted | drafts before it accepted), so d drafts
    yield 1 + sum_{j<=d} prod_{i<=j} acceptance_i tokens (the 1 is the correction or bonus).
    """
    k_max = acceptance.shape[1]
    reach = np.cumprod(np.clip(acceptance, 0.0, 1.0), axis=1)
    by_drafts = 1.0 + np.concatenate([np.zeros_like(reach[:, :1]), np.cumsum(reach, axis=1)], axis=1)
    drafts = np.minimum(np.arange(k_max + 1)[None, :], available[:, None])
    return np.take_along_axis(by_drafts, drafts, axis=1)


def round_plan(
    acceptance: np.ndarray,
    available: np.ndarray,
    active: np.ndarray,
    all_greedy: bool | np.ndarray,
    costs: CostModel,
    min_gain: float = 1.0,
) -> np.ndarray:
    """Draft lengths [B] for the next round, all zero when a plain step is the better use of the batch.

    The batch shares one round: it drafts max(plan) steps and verifies k_max + 1 positions for
    every running row, so the decision is the batch's. A round drafting k steps (each row
    min(k, available), what it can actually propose) is taken when its expected tokens per unit
    of cost beat a plain step's (one token per running row) by min_gain; rows that would draft
    nothing still pay for it and are counted with the one token they get. Costs come `on_host`.
    """
    k_max = acceptance.shape[1]
    num_active = np.sum(active)
    tokens = np.sum(np.where(active[:, None], expected_tokens(acceptance, available), 0.0), axis=0)
    speedup = tokens / round_cost(num_active, all_greedy, costs, k_max) / np.maximum(num_active, 1)
    # argmax keeps the first maximum: speculate only on a strict gain over a plain step.
    speedup = np.where(np.arange(k_max + 1) == 0, min_gain, speedup)
    k = np.argmax(speedup).astype(np.int32)
    return np.where(active, np.minimum(k, available), 0).astype(np.int32)
