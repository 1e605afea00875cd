"""What a speculative round costs, relative to one plain decode step, and the draft length it implies.

Round cost for k >= 1 drafts is modelled as base + k * per_draft: verifying k+1 tokens costs a
fixed part plus a slope per token, and each draft step adds its own cost. The numbers either
come from a heuristic (the forward is memory bound until `verify_saturation_tokens` tokens per
pass) or are measured once per batch size on the device itself (`calibrate`), which is what
makes the switch-off right on a CPU, where every verified token costs real compute, as much as
on an accelerator, where extra tokens are nearly free until the batch is large.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxinfer.config import ModelConfig
from jaxinfer.generation import DecodeState, decode_step
from jaxinfer.models import Weights
from jaxinfer.speculative.config import SpeculativeConfig
from jaxinfer.speculative.proposers import Proposer
from jaxinfer.speculative.verify import verify_forward

PROBE_ITERATIONS = 16
PROBE_REPEATS = 5


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class CostModel:
    """Round cost in plain-step units: base + k * (per_draft + per_active_row * running sequences)."""

    base: jax.Array  # [] float32
    per_draft: jax.Array  # [] float32
    per_active_row: jax.Array  # [] float32


def heuristic_costs(draft_cost: float, spec: SpeculativeConfig) -> CostModel:
    """Extra verified tokens nearly free until the pass holds verify_saturation_tokens tokens."""
    return CostModel(
        jnp.float32(1.0), jnp.float32(draft_cost), jnp.float32(1.0 / spec.verify_saturation_tokens)
    )


def planned_draft_len(acceptance: jax.Array, num_active: jax.Array, costs: CostModel, k_max: int) -> jax.Array:
    """Draft length [B] in 0..k_max maximising expected tokens per unit of cost (0 = plain decode).

    With per-token acceptance a, k drafts yield (1 - a^(k+1)) / (1 - a) tokens per round.
    """
    ks = jnp.arange(k_max + 1, dtype=jnp.float32)[None, :]
    a = jnp.clip(acceptance, 0.0, 0.999)[:, None]
    expected_tokens = (1.0 - a ** (ks + 1.0)) / (1.0 - a)
    per_draft = costs.per_draft + jnp.minimum(costs.per_active_row * num_active.astype(jnp.float32), 1.0)
    gain = expected_tokens / (costs.base + ks * per_draft)
    gain = gain.at[:, 0].set(1.0)  # argmax keeps the first maximum: speculate only on a strict gain
    return jnp.argmax(gain, axis=1).astype(jnp.int32)


def probe(
    weights: Weights,
    draft_params: Any,
    state: DecodeState,
    proposer_state: Any,
    cfg: ModelConfig,
    proposer: Proposer,
    kind: str,
    k: int,
) -> jax.Array:
    """PROBE_ITERATIONS of one part of a round, for timing: "plain" step, "verify" of k drafts, or "draft"."""
    def body(i: jax.Array, carry: tuple) -> tuple:
        d, pstate, acc = carry
        if kind == "plain":
            cache, out = decode_step(weights, d, cfg).cache, jnp.int32(0)
        elif kind == "verify":
            drafts = jnp.zeros((d.lengths.shape[0], k), jnp.int32) + acc
            _, logprobs, cache = verify_forward(weights, d, drafts, cfg)
            out = jnp.argmax(logprobs[:, -1], axis=-1).sum()
        else:
            proposal = proposer.propose(draft_params, d, pstate, k)
            cache, pstate, out = d.cache, proposal.state, proposal.tokens.sum()
        return dataclasses.replace(d, cache=cache), pstate, (acc + out) % 3

    d, pstate, acc = jax.lax.fori_loop(0, PROBE_ITERATIONS, body, (state, proposer_state, jnp.int32(0)))
    return acc + jnp.sum(jnp.stack([x.ravel()[0] for x in jax.tree.leaves((d.cache, pstate))])).astype(jnp.int32)


def calibrate(
    probe_fn: Callable[..., jax.Array],
    weights: Weights,
    draft_params: Any,
    state: DecodeState,
    proposer_state: Any,
    cfg: ModelConfig,
    proposer: Proposer,
    k_max: int,
) -> CostModel:
    """Time a plain step, verification of 1 and k_max drafts, and drafting, at this batch size.

    The probes are interleaved and each keeps its best time, so a burst of load from other
    processes skews one sample, not the ratios.
    """
    kinds = {"plain": ("plain", 1), "verify_one": ("verify", 1), "verify_all": ("verify", k_max), "draft": ("draft", k_max)}
    runs = {
        name: functools.partial(
            probe_fn, weights, draft_params, state, proposer_state, cfg=cfg, proposer=proposer, kind=kind, k=k
        )
        for name, (kind, k) in kinds.items()
    }
    for run in runs.values():
        jax.block_until_ready(run())  # compile
    best = {name: float("inf") for name in runs}
    for _ in range(PROBE_REPEATS):
        for name, run in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(run())
            best[name] = min(best[name], time.perf_counter() - start)
    plain, draft = best["plain"], best["draft"] / k_max
    slope = max(best["verify_all"] - best["verify_one"], 0.0) / max(k_max - 1, 1)
    return CostModel(
        jnp.float32((best["verify_one"] - slope) / plain), jnp.float32((slope + draft) / plain), jnp.float32(0.0)
    )
