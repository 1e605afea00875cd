"""A speculative round's cost in plain decode steps and the draft length it implies (no jax).

A round always verifies k_max + 1 positions (static shapes) and drafts as many steps as the
longest plan in the batch, so its cost is round_base + steps * per_draft plain steps, with a
separate pair for all-greedy batches (no softmax or random draws) and sampled ones. The engine
plans with them on the host in NumPy (each function picks its array module from its inputs); its
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


def _xp(x: Any) -> Any:
    """NumPy for host arrays (the engine plans on the host, where each eager jax op costs a dispatch),
    jax.numpy for device arrays and tracers (the on-device loop; imported only then)."""
    if isinstance(x, (np.ndarray, np.generic, int, float, bool)):
        return np
    import jax.numpy as jnp

    return jnp


def on_host(costs: CostModel) -> CostModel:
    """The cost model as NumPy arrays, for planning on the host."""
    return CostModel(np.asarray(costs.round_base), np.asarray(costs.per_draft), np.asarray(costs.verify_per_row))


def round_cost(num_active: Any, all_greedy: Any, costs: CostModel, k_max: int) -> Any:
    """Cost [k_max + 1] in plain steps of a round that drafts 0..k_max steps (verifying k_max + 1 wide)."""
    xp = _xp(costs.round_base)
    ks = xp.arange(k_max + 1, dtype=xp.float32)
    mode = xp.where(all_greedy, 0, 1)
    verify_extra = k_max * xp.minimum(costs.verify_per_row * xp.asarray(num_active, xp.float32), 1.0)
    return costs.round_base[mode] + verify_extra + ks * costs.per_draft[mode]


def expected_tokens(acceptance: Any, available: Any) -> Any:
    """Expected tokens [B, k_max + 1] a round drafting k steps yields, each row drafting min(k, available).

    acceptance [B, k_max] holds P(draft i accepted | drafts before it accepted), so d drafts
    yield 1 + sum_{j<=d} prod_{i<=j} acceptance_i tokens (the 1 is the correction or bonus).
    """
    xp = _xp(acceptance)
    k_max = acceptance.shape[1]
    reach = xp.cumprod(xp.clip(acceptance, 0.0, 1.0), axis=1)
    by_drafts = 1.0 + xp.concatenate([xp.zeros_like(reach[:, :1]), xp.cumsum(reach, axis=1)], axis=1)
    drafts = xp.minimum(xp.arange(k_max + 1)[None, :], available[:, None])
    return xp.take_along_axis(by_drafts, drafts, axis=1)


def round_plan(
    acceptance: Any,
    available: Any,
    active: Any,
    all_greedy: Any,
    costs: CostModel,
    min_gain: float = 1.0,
) -> Any:
    """Draft lengths [B] for the next round, all zero when a plain step is the better use of the batch.

    The batch shares one round: it drafts max(plan) steps and verifies k_max + 1 positions for
    every running row, so the decision is the batch's. A round drafting k steps (each row
    min(k, available), what it can actually propose) is taken when its expected tokens per unit
    of cost beat a plain step's (one token per running row) by min_gain; rows that would draft
    nothing still pay for it and are counted with the one token they get. NumPy arrays (with
    `on_host` costs) are planned in NumPy, jax arrays in jax.
    """
    xp = _xp(acceptance)
    k_max = acceptance.shape[1]
    num_active = xp.sum(active)
    tokens = xp.sum(xp.where(active[:, None], expected_tokens(acceptance, available), 0.0), axis=0)
    speedup = tokens / round_cost(num_active, all_greedy, costs, k_max) / xp.maximum(num_active, 1)
    # argmax keeps the first maximum: speculate only on a strict gain over a plain step.
    speedup = xp.where(xp.arange(k_max + 1) == 0, min_gain, speedup)
    k = xp.argmax(speedup).astype(xp.int32)
    return xp.where(active, xp.minimum(k, available), 0).astype(xp.int32)
