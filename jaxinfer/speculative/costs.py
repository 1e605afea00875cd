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

from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights
from jaxinfer.models.contiguous_decode import DecodeState
from jaxinfer.speculative.config import SpeculativeConfig
from jaxinfer.speculative.proposers import Proposer

# Each probe runs PROBE_ITERATIONS rounds on device and blocks once; fewer, longer runs keep the
# first adaptive call short (2 modes x 3 probes x (1 + PROBE_REPEATS) blocking runs).
PROBE_ITERATIONS = 8
PROBE_REPEATS = 4


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


def _xp(x: Any) -> Any:
    """NumPy for host arrays (the engine plans on the host, where each eager jax op costs a dispatch),
    jax.numpy for device arrays and tracers (the on-device loop)."""
    return jnp if isinstance(x, jax.Array) else np


def on_host(costs: CostModel) -> CostModel:
    """The cost model as NumPy arrays, for planning on the host."""
    return CostModel(np.asarray(costs.round_base), np.asarray(costs.per_draft), np.asarray(costs.verify_per_row))


def round_cost(num_active: jax.Array, all_greedy: jax.Array, costs: CostModel, k_max: int) -> jax.Array:
    """Cost [k_max + 1] in plain steps of a round that drafts 0..k_max steps (verifying k_max + 1 wide)."""
    xp = _xp(costs.round_base)
    ks = xp.arange(k_max + 1, dtype=xp.float32)
    mode = xp.where(all_greedy, 0, 1)
    verify_extra = k_max * xp.minimum(costs.verify_per_row * xp.asarray(num_active, xp.float32), 1.0)
    return costs.round_base[mode] + verify_extra + ks * costs.per_draft[mode]


def expected_tokens(acceptance: jax.Array, available: jax.Array) -> jax.Array:
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
    acceptance: jax.Array,
    available: jax.Array,
    active: jax.Array,
    all_greedy: jax.Array,
    costs: CostModel,
    min_gain: float = 1.0,
) -> jax.Array:
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


def calibrate(
    probe_fn: Callable[..., tuple[jax.Array, DecodeState, Any]],
    weights: Weights,
    draft_params: Any,
    state: DecodeState,
    proposer_state: Any,
    cfg: ModelConfig,
    proposer: Proposer,
    spec: SpeculativeConfig,
) -> tuple[CostModel, DecodeState, Any]:
    """Time plain steps and rounds of 1 and k_max draft steps, greedy and sampled, at this batch size.

    The probes donate the state and hand it back (so no run copies the KV cache); the state is
    returned with its sampling settings as given. The probes are timed round-robin and each
    keeps its fastest repeat: load from other processes only ever slows a run down, so the
    minimum is the least disturbed measurement.
    """
    k = spec.num_speculative_tokens
    temperature = state.sampling.temperature
    base, per_draft = [], []
    runs = {"plain": (0, "plain"), 1: (1, "round"), k: (k, "round")}
    for greedy in (True, False):
        probed = jnp.full_like(temperature, 0.0 if greedy else 1.0)
        state = dataclasses.replace(state, sampling=dataclasses.replace(state.sampling, temperature=probed))
        run = functools.partial(probe_fn, weights, draft_params, cfg=cfg, proposer=proposer, spec=spec)
        seconds, (state, proposer_state) = _timings(run, runs, (state, proposer_state))
        t = {name: float(np.min(value)) for name, value in seconds.items()}
        slope = max(t[k] - t[1], 0.0) / max(k - 1, 1)
        # Noise can make the 1-draft round look cheaper than its draft step: a round costs >= 0.
        base.append(max(t[1] - slope, 0.0) / t["plain"])
        per_draft.append(slope / t["plain"])
    state = dataclasses.replace(state, sampling=dataclasses.replace(state.sampling, temperature=temperature))
    costs = CostModel(jnp.asarray(base, jnp.float32), jnp.asarray(per_draft, jnp.float32), jnp.float32(0.0))
    return costs, state, proposer_state


def _timings(
    run: Callable[..., tuple[jax.Array, DecodeState, Any]], runs: dict[Any, tuple[int, str]], carry: tuple
) -> tuple[dict[Any, np.ndarray], tuple]:
    """Seconds per repeat [PROBE_REPEATS] of each (steps, kind) probe, timed back to back, and the state after."""

    def once(name: Any, carry: tuple) -> tuple[float, tuple]:
        steps, kind = runs[name]
        start = time.perf_counter()
        done, *carry = run(*carry, jnp.int32(steps), kind=kind)
        jax.block_until_ready(done)
        return time.perf_counter() - start, tuple(carry)

    for name in runs:
        _, carry = once(name, carry)  # compile (the round probe compiles once for every step count)
    times: dict[Any, list[float]] = {name: [] for name in runs}
    for _ in range(PROBE_REPEATS):
        for name in runs:
            seconds, carry = once(name, carry)
            times[name].append(seconds)
    return {name: np.asarray(value) for name, value in times.items()}, carry
