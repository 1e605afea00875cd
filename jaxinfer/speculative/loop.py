"""The speculative draft-verify loop: one lax.while_loop, nothing returns to the host between rounds.

Each round drafts k tokens per sequence, verifies all k+1 positions with one target forward
(the last accepted token plus the k drafts), accepts a prefix, appends it and the correction or
bonus token, and rolls the caches back by not advancing `lengths`: entries past a sequence's
length are invisible to the causal mask and overwritten next round. Per-sequence draft lengths
adapt by masking; when no sequence expects a gain the round is a plain decode step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config import ModelConfig
from jaxinfer.generation import DecodeState, decode_step
from jaxinfer.models import Weights
from jaxinfer.speculative.config import SpeculativeConfig
from jaxinfer.speculative.costs import CostModel, planned_draft_len
from jaxinfer.speculative.proposers import Proposer
from jaxinfer.speculative.rejection import Verdict, verify
from jaxinfer.speculative.stats import SpecCounters, zero_counters
from jaxinfer.speculative.verify import accepted_run, append_run, verify_forward

# How fast an unobserved sequence's acceptance estimate drifts back to the prior, so a
# sequence that stopped speculating (or found no n-gram) is retried now and then.
RELAX_RATE = 0.05


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Adaptation:
    """Per-sequence acceptance estimates that choose each round's draft length."""

    acceptance: jax.Array  # [B] float32 moving average of P(accept) per drafted token
    plain_only: jax.Array  # [] bool: a stateful proposer missed a plain step; stay plain


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SpecState:
    """Everything the speculative loop carries between rounds."""

    decode: DecodeState
    proposer_state: Any
    adapt: Adaptation
    counters: SpecCounters
    plan: jax.Array  # [B] int32 next round's draft length per sequence (0 = plain)
    available: jax.Array  # [B] int32 tokens the proposer can draft next round


def speculative_decode(
    weights: Weights,
    draft_params: Any,
    state: DecodeState,
    proposer_state: Any,
    costs: CostModel,
    cfg: ModelConfig,
    proposer: Proposer,
    spec: SpeculativeConfig,
    prompt_bucket: int,
) -> tuple[DecodeState, Any, SpecCounters]:
    """Decode prefilled sequences to completion speculatively; returns state, proposer state, counters."""
    batch, k = state.lengths.shape[0], spec.num_speculative_tokens
    adapt = Adaptation(jnp.full((batch,), spec.initial_acceptance, jnp.float32), jnp.asarray(False))
    pstate = proposer.prefill(draft_params, state, proposer_state, prompt_bucket)
    no_plan = jnp.zeros((batch,), jnp.int32)
    carry = SpecState(state, pstate, adapt, zero_counters(batch, k), no_plan, no_plan)
    carry = _replan(draft_params, carry, costs, proposer, spec)

    def running(s: SpecState) -> jax.Array:
        return ~jnp.all(s.decode.done)

    def wants_spec(s: SpecState) -> jax.Array:
        return jnp.any(s.plan > 0) & ~s.adapt.plain_only

    def spec_round(s: SpecState) -> SpecState:
        s = _spec_round(weights, draft_params, s, cfg, proposer, spec)
        return _replan(draft_params, s, costs, proposer, spec)

    def plain_round(s: SpecState) -> SpecState:
        return _replan(draft_params, _plain_round(weights, s, cfg, proposer, spec), costs, proposer, spec)

    # Runs of plain steps and runs of speculative rounds as two inner while loops rather than a
    # lax.cond per round: XLA copies the whole KV cache into and out of a conditional.
    def segment(s: SpecState) -> SpecState:
        s = jax.lax.while_loop(lambda s: running(s) & ~wants_spec(s), plain_round, s)
        return jax.lax.while_loop(lambda s: running(s) & wants_spec(s), spec_round, s)

    carry = jax.lax.while_loop(running, segment, carry)
    return carry.decode, carry.proposer_state, carry.counters


def _replan(draft_params: Any, s: SpecState, costs: CostModel, proposer: Proposer, spec: SpeculativeConfig) -> SpecState:
    """Choose the next round's draft length per sequence from its acceptance estimate and the costs."""
    k = spec.num_speculative_tokens
    active = ~s.decode.done
    if spec.adaptive:
        k_plan = planned_draft_len(s.adapt.acceptance, jnp.sum(active), costs, k)
    else:
        k_plan = jnp.full(active.shape, k, jnp.int32)
    available = proposer.available(draft_params, s.decode, s.proposer_state, k)
    plan = jnp.where(active, jnp.minimum(k_plan, available), 0)
    return dataclasses.replace(s, plan=plan, available=available)


def _spec_round(
    weights: Weights, draft_params: Any, s: SpecState, cfg: ModelConfig, proposer: Proposer, spec: SpeculativeConfig
) -> SpecState:
    """Draft, verify with one target forward, accept, append, and update the estimates."""
    d = s.decode
    active = ~d.done
    proposal = proposer.propose(draft_params, d, s.proposer_state, spec.num_speculative_tokens)
    hidden, target_logprobs, cache = verify_forward(weights, d, proposal.tokens, cfg)
    verdict = verify(target_logprobs, proposal.logprobs, proposal.tokens, s.plan, d.sampling, d.lengths, spec.rule)
    run = accepted_run(proposal.tokens, verdict)
    decode, emitted = append_run(dataclasses.replace(d, cache=cache), run, verdict.num_accepted + 1)
    pstate = proposer.after_verify(draft_params, proposal.state, hidden, verdict.num_accepted)
    counters = _count_round(s.counters, s.plan, verdict.num_accepted, emitted, active)
    adapt = _observe(s.adapt, verdict, s.available, active, spec)
    return dataclasses.replace(s, decode=decode, proposer_state=pstate, adapt=adapt, counters=counters)


def _plain_round(weights: Weights, s: SpecState, cfg: ModelConfig, proposer: Proposer, spec: SpeculativeConfig) -> SpecState:
    """An ordinary decode step; a stateful proposer's cache misses it, so it stays off afterwards."""
    decode = decode_step(weights, s.decode, cfg)
    c = s.counters
    counters = dataclasses.replace(
        c,
        target_passes=c.target_passes + (~s.decode.done).astype(jnp.int32),
        emitted=c.emitted + decode.lengths - s.decode.lengths,
    )
    adapt = Adaptation(_relax(s.adapt.acceptance, spec), s.adapt.plain_only | proposer.stateful)
    return dataclasses.replace(s, decode=decode, adapt=adapt, counters=counters)


def _count_round(
    c: SpecCounters, k_eff: jax.Array, num_accepted: jax.Array, emitted: jax.Array, active: jax.Array
) -> SpecCounters:
    j = jnp.arange(c.drafted_at.shape[1])[None, :]
    return SpecCounters(
        drafted=c.drafted + k_eff,
        accepted=c.accepted + num_accepted,
        drafted_at=c.drafted_at + (j < k_eff[:, None]).astype(jnp.int32),
        accepted_at=c.accepted_at + (j < num_accepted[:, None]).astype(jnp.int32),
        spec_passes=c.spec_passes + (k_eff > 0).astype(jnp.int32),
        target_passes=c.target_passes + active.astype(jnp.int32),
        emitted=c.emitted + emitted,
    )


def _observe(
    adapt: Adaptation, verdict: Verdict, available: jax.Array, active: jax.Array, spec: SpeculativeConfig
) -> Adaptation:
    """Fold this round's exact acceptance probabilities into the moving average.

    sum_v min(p, q) is P(accept) itself, a lower-variance signal than the accept/reject coin; it
    is valid at every draft position whose prefix was accepted, and measured even for sequences
    whose k is 0 (the draft still runs for the batch), so they can switch back on.
    """
    k = verdict.expected_acceptance.shape[1]
    j = jnp.arange(k)[None, :]
    valid = (j <= verdict.num_accepted[:, None]) & (j < available[:, None]) & active[:, None]
    count = jnp.sum(valid, axis=1)
    observed = jnp.sum(jnp.where(valid, verdict.expected_acceptance, 0.0), axis=1) / jnp.maximum(count, 1)
    decay = spec.acceptance_decay
    updated = decay * adapt.acceptance + (1.0 - decay) * observed
    acceptance = jnp.where(count > 0, updated, _relax(adapt.acceptance, spec))
    return dataclasses.replace(adapt, acceptance=acceptance)


def _relax(acceptance: jax.Array, spec: SpeculativeConfig) -> jax.Array:
    return acceptance + RELAX_RATE * (spec.initial_acceptance - acceptance)
