"""What a speculative round costs, relative to one plain decode step, measured on the device.

The cost model and the plan it implies are `round_plan`'s (no jax). The numbers come from a
heuristic (extra verified tokens are nearly free until a pass holds
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
from jaxinfer.speculative.round_plan import CostModel, heuristic_costs

# Each probe runs PROBE_ITERATIONS rounds on device and blocks once; fewer, longer runs keep the
# first adaptive call short (2 modes x 3 probes x (1 + PROBE_REPEATS) blocking runs).
PROBE_ITERATIONS = 8
PROBE_REPEATS = 4


def device_heuristic_costs(draft_cost: float, spec: SpeculativeConfig) -> CostModel:
    """`round_plan.heuristic_costs` as device arrays (the static loop indexes them with traced values)."""
    return CostModel(*(jnp.asarray(x) for x in heuristic_costs(draft_cost, spec)))


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
