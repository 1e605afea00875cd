"""What a speculative round costs, relative to one plain decode step, and the draft length it implies.

A round always verifies k_max + 1 positions (static shapes) and drafts as many steps as the
longest plan in the batch, so its cost is round_base + steps * per_draft plain steps, with a
separate pair for all-greedy batches (no softmax or random draws) and sampled ones. The numbers
come from a heuristic (extra verified tokens are nearly free until a pass holds
`verify_saturation_tokens` tokens) or are measured on the device once per batch size
(`calibrate`). Measuring is what makes the switch-off right on a CPU, where every verified
token costs real compute; on an accelerator extra tokens are nearly free until the batch is large.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config import ModelConfig
from jaxinfer.generation import DecodeState
from jaxinfer.models import Weights
from jaxinfer.speculative.config import SpeculativeConfig
from jaxinfer.speculative.proposers import Proposer

PROBE_ITERATIONS = 4
PROBE_REPEATS = 15


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class CostModel:
    """Round cost in plain-step units; index 0 of each pair is for all-greedy batches, 1 for sampled."""

    round_base: jax.Array  # [2] float32 verify + bookkeeping, excluding draft steps
    per_draft: jax.Array  # [2] float32 one draft step
    verify_per_row: jax.Array  # [] float32 heuristic only: per verified token and running sequence


def heuristic_costs(draft_cost: float, spec: SpeculativeConfig) -> CostModel:
    """Verification nearly free until the pass holds verify_saturation_tokens tokens."""
    return CostModel(
        jnp.ones((2,), jnp.float32),
        jnp.full((2,), draft_cost, jnp.float32),
        jnp.float32(1.0 / spec.verify_saturation_tokens),
    )


def planned_draft_len(
    acceptance: jax.Array,
    num_active: jax.Array,
    all_greedy: jax.Array,
    costs: CostModel,
    k_max: int,
    min_gain: float = 1.0,
) -> jax.Array:
    """Draft length [B] in 0..k_max maximising expected tokens per unit of cost (0 = plain decode).

    Drafting must beat plain decoding by min_gain (a margin for noise in the estimates).

    acceptance [B, k_max] holds P(draft i accepted | drafts before it accepted), so k drafts
    yield 1 + sum_{j<=k} prod_{i<=j} acceptance_i tokens per round.
    """
    ks = jnp.arange(k_max + 1, dtype=jnp.float32)[None, :]
    reach = jnp.cumprod(jnp.clip(acceptance, 0.0, 1.0), axis=1)
    expected_tokens = 1.0 + jnp.concatenate([jnp.zeros_like(reach[:, :1]), jnp.cumsum(reach, axis=1)], axis=1)
    mode = jnp.where(all_greedy, 0, 1)
    verify_extra = k_max * jnp.minimum(costs.verify_per_row * num_active.astype(jnp.float32), 1.0)
    gain = expected_tokens / (costs.round_base[mode] + verify_extra + ks * costs.per_draft[mode])
    gain = gain.at[:, 0].set(min_gain)  # argmax keeps the first maximum: speculate only on a strict gain
    return jnp.argmax(gain, axis=1).astype(jnp.int32)


def calibrate(
    probe_fn: Callable[..., jax.Array],
    weights: Weights,
    draft_params: Any,
    state: DecodeState,
    proposer_state: Any,
    cfg: ModelConfig,
    proposer: Proposer,
    spec: SpeculativeConfig,
) -> CostModel:
    """Time plain steps and rounds of 1 and k_max draft steps, greedy and sampled, at this batch size.

    The probes are timed round-robin and each keeps its fastest repeat: load from other
    processes only ever slows a run down, so the minimum is the least disturbed measurement.
    """
    k = spec.num_speculative_tokens
    base, per_draft = [], []
    for greedy in (True, False):
        temperature = jnp.full_like(state.sampling.temperature, 0.0 if greedy else 1.0)
        probed = dataclasses.replace(state, sampling=dataclasses.replace(state.sampling, temperature=temperature))
        run = functools.partial(
            probe_fn, weights, draft_params, probed, proposer_state, cfg=cfg, proposer=proposer, spec=spec
        )
        runs = {"plain": functools.partial(run, jnp.int32(0), kind="plain")}
        runs.update({steps: functools.partial(run, jnp.int32(steps), kind="round") for steps in {1, k}})
        t = {name: float(np.min(seconds)) for name, seconds in _timings(runs).items()}
        slope = max(t[k] - t[1], 0.0) / max(k - 1, 1)
        base.append((t[1] - slope) / t["plain"])
        per_draft.append(slope / t["plain"])
    return CostModel(jnp.asarray(base, jnp.float32), jnp.asarray(per_draft, jnp.float32), jnp.float32(0.0))


def _timings(runs: dict[Any, Callable[[], jax.Array]]) -> dict[Any, np.ndarray]:
    """Seconds per repeat [PROBE_REPEATS] of each run, timed back to back within a repeat."""
    for run in runs.values():
        jax.block_until_ready(run())  # compile (the round probe compiles once for every step count)
    times: dict[Any, list[float]] = {name: [] for name in runs}
    for _ in range(PROBE_REPEATS):
        for name, run in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(run())
            times[name].append(time.perf_counter() - start)
    return {name: np.asarray(value) for name, value in times.items()}
