"""The speculative draft-verify loop: one lax.while_loop, nothing returns to the host between rounds.

Each round drafts up to k tokens per sequence (as many steps as the longest plan in the batch),
verifies all k+1 positions with one target forward (the last accepted token plus the drafts),
accepts a prefix, appends it and the correction or bonus token, and rolls the caches back by not
advancing `lengths`: entries past a sequence's length are invisible to the causal mask and
overwritten next round. Per-sequence draft lengths adapt by masking; when no sequence expects a
gain the loop takes plain decode steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, lm_logits
from jaxinfer.models.contiguous_decode import DecodeState, append_tokens
from jaxinfer.sampling.sampler import sample
from jaxinfer.speculative.config import SpeculativeConfig
from jaxinfer.speculative.costs import PROBE_ITERATIONS, device_heuristic_costs
from jaxinfer.speculative.features import target_forward
from jaxinfer.speculative.proposers import Proposer
from jaxinfer.speculative.rejection import Verdict, draw, position_keys, sampled_logprobs, verify
from jaxinfer.speculative.round_plan import CostModel, round_plan
from jaxinfer.speculative.stats import SpecCounters, zero_counters
from jaxinfer.speculative.verify import accepted_run, append_run, verify_forward

REPROBE_PLAIN_STEPS = 32  # plain steps in a row before a stateful proposer's first measuring round


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Adaptation:
    """Per-sequence acceptance estimates that choose each round's draft length."""

    acceptance: jax.Array  # [B, K] float32 moving average of P(draft i accepted | drafts before it were)
    observed: jax.Array  # [B, K] int32 rounds that measured it (the first ones replace the prior)
    plain_run: jax.Array  # [] int32 plain steps since the last round
    reprobe_after: jax.Array  # [] int32 plain steps in a row after which a stateful proposer drafts once


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class AcceptancePrior:
    """What earlier calls learned, the starting estimate of every sequence of the next call."""

    acceptance: jax.Array  # [K] float32 mean estimate per draft position
    observed: jax.Array  # [] int32 1 once a call measured it (it then counts as one observation)


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


def no_prior(spec: SpeculativeConfig) -> AcceptancePrior:
    """The configured initial acceptance, counted as unmeasured."""
    k = spec.num_speculative_tokens
    return AcceptancePrior(jnp.full((k,), spec.initial_acceptance, jnp.float32), jnp.int32(0))


def prefill_proposer(
    draft_params: Any, state: DecodeState, proposer_state: Any, features: jax.Array | None, proposer: Proposer,
    prompt_bucket: int,
) -> Any:
    """The proposer's state after reading the prompts (its own program, so the loop is one per batch bucket).

    features [B, prompt_bucket, F]: the target's over the prompts, for a proposer that reads them.
    """
    return proposer.prefill(draft_params, state, proposer_state, prompt_bucket, features)


def speculative_decode(
    weights: Weights,
    draft_params: Any,
    state: DecodeState,
    proposer_state: Any,
    prior: AcceptancePrior,
    costs: CostModel,
    cfg: ModelConfig,
    proposer: Proposer,
    spec: SpeculativeConfig,
) -> tuple[DecodeState, Any, AcceptancePrior, SpecCounters]:
    """Decode prefilled sequences (proposer state prefilled too) to completion speculatively.

    Returns the state, the proposer state, the acceptance learned (the next call's prior) and counters.
    """
    carry = _replan(draft_params, initial_state(state, proposer_state, spec, prior), costs, proposer, spec)

    def running(s: SpecState) -> jax.Array:
        return ~jnp.all(s.decode.done)

    def wants_spec(s: SpecState) -> jax.Array:
        return jnp.any(s.plan > 0)

    def spec_round(s: SpecState) -> SpecState:
        s = _spec_round(weights, draft_params, s, cfg, proposer, spec)
        return _replan(draft_params, s, costs, proposer, spec)

    def plain_round(s: SpecState) -> SpecState:
        s = _plain_round(weights, draft_params, s, cfg, proposer, spec)
        return _replan(draft_params, s, costs, proposer, spec)

    # Runs of plain steps and runs of speculative rounds as two inner while loops rather than a
    # lax.cond per round: XLA copies the whole KV cache into and out of a conditional. Between
    # them a stateful proposer catches up with what the plain steps appended.
    def segment(s: SpecState) -> SpecState:
        since = s.decode.lengths
        s = jax.lax.while_loop(lambda s: running(s) & ~wants_spec(s), plain_round, s)
        pstate = proposer.resync(draft_params, s.decode, s.proposer_state, since)
        s = dataclasses.replace(s, proposer_state=pstate)
        return jax.lax.while_loop(lambda s: running(s) & wants_spec(s), spec_round, s)

    carry = jax.lax.while_loop(running, segment, carry)
    # A draft model is measured only in rounds, never during plain steps, so each call starts it
    # unmeasured (one optimistic round); n-gram estimates stay current and carry over.
    learned = prior if proposer.stateful else learned_prior(carry.adapt, prior)
    return carry.decode, carry.proposer_state, learned, carry.counters


def initial_state(
    state: DecodeState, proposer_state: Any, spec: SpeculativeConfig, prior: AcceptancePrior | None = None
) -> SpecState:
    """Loop state before the first round: every sequence starts from the prior, nothing counted, no plan yet."""
    prior = no_prior(spec) if prior is None else prior
    batch, k = state.lengths.shape[0], spec.num_speculative_tokens
    acceptance = jnp.broadcast_to(prior.acceptance[None, :], (batch, k))
    observed = jnp.full((batch, k), prior.observed, jnp.int32)
    adapt = Adaptation(acceptance, observed, jnp.int32(0), jnp.int32(REPROBE_PLAIN_STEPS))
    no_plan = jnp.zeros((batch,), jnp.int32)
    return SpecState(state, proposer_state, adapt, zero_counters(batch, k), no_plan, no_plan)


def learned_prior(adapt: Adaptation, prior: AcceptancePrior) -> AcceptancePrior:
    """Mean estimate per position over the sequences that measured it; the old prior where none did."""
    measured = adapt.observed > prior.observed
    count = jnp.sum(measured, axis=0)
    mean = jnp.sum(jnp.where(measured, adapt.acceptance, 0.0), axis=0) / jnp.maximum(count, 1)
    acceptance = jnp.where(count > 0, mean, prior.acceptance)
    return AcceptancePrior(acceptance, jnp.maximum(prior.observed, jnp.any(count > 0).astype(jnp.int32)))


def probe(
    weights: Weights,
    draft_params: Any,
    state: DecodeState,
    proposer_state: Any,
    steps: jax.Array,
    cfg: ModelConfig,
    proposer: Proposer,
    spec: SpeculativeConfig,
    kind: str,
) -> tuple[jax.Array, DecodeState, Any]:
    """PROBE_ITERATIONS plain rounds or speculative rounds of `steps` drafts, for timing the cost model.

    Returns a scalar to wait on and the state and proposer state, unchanged but for entries past
    each sequence's length: handing them back lets the caller donate them, so no probe copies the cache.
    """
    costs = device_heuristic_costs(proposer.draft_cost, spec)

    def body(i: jax.Array, s: SpecState) -> SpecState:
        if kind == "plain":
            after = _plain_round(weights, draft_params, s, cfg, proposer, spec)
        else:
            planned = dataclasses.replace(s, plan=jnp.where(s.decode.done, 0, steps))
            after = _spec_round(weights, draft_params, planned, cfg, proposer, spec)
        after = _replan(draft_params, after, costs, proposer, spec)
        # Same positions every iteration, so each one does the same work.
        decode = dataclasses.replace(after.decode, lengths=s.decode.lengths, done=s.decode.done)
        return dataclasses.replace(after, decode=decode)

    s = jax.lax.fori_loop(0, PROBE_ITERATIONS, body, initial_state(state, proposer_state, spec))
    touched = [x.ravel()[0].astype(jnp.float32) for x in jax.tree.leaves(s.counters)]
    return jnp.sum(jnp.stack(touched)), s.decode, s.proposer_state


def _replan(
    draft_params: Any, s: SpecState, costs: CostModel, proposer: Proposer, spec: SpeculativeConfig
) -> SpecState:
    """Choose the next round's draft lengths from the estimates, what the proposer can draft, and the costs."""
    k = spec.num_speculative_tokens
    active = ~s.decode.done
    available = proposer.available(draft_params, s.decode, s.proposer_state, k)
    if spec.adaptive:
        greedy = jnp.all(s.decode.sampling.temperature <= 0)
        # Until a sequence has been measured, count on full acceptance: one round finds out.
        unmeasured = (s.adapt.observed[:, :1] == 0)
        acceptance = jnp.where(unmeasured, 1.0, s.adapt.acceptance)
        plan = round_plan(acceptance, available, active, greedy, costs, spec.min_gain)
        if proposer.stateful:
            plan, adapt = _reprobe(s.adapt, plan, jnp.where(active, available, 0))
            s = dataclasses.replace(s, adapt=adapt)
    else:
        plan = jnp.where(active, available, 0)
    return dataclasses.replace(s, plan=plan, available=available)


def _reprobe(adapt: Adaptation, plan: jax.Array, everything: jax.Array) -> tuple[jax.Array, Adaptation]:
    """The plan, or drafting `everything` the rows can when a stateful proposer's run of plain steps
    is due a measuring round (it is measured only in rounds); each such round doubles the run that
    earns the next, a bounded overhead where drafts keep failing, while one unlucky round no
    longer ends speculation for the rest of the call."""
    due = (adapt.plain_run >= adapt.reprobe_after) & ~jnp.any(plan > 0)
    adapt = dataclasses.replace(
        adapt, plain_run=jnp.where(due, 0, adapt.plain_run),
        reprobe_after=jnp.where(due, 2 * adapt.reprobe_after, adapt.reprobe_after),
    )
    return jnp.where(due, everything, plan), adapt


def _spec_round(
    weights: Weights,
    draft_params: Any,
    s: SpecState,
    cfg: ModelConfig,
    proposer: Proposer,
    spec: SpeculativeConfig,
) -> SpecState:
    """Draft, verify with one target forward, accept, append, and update the estimates."""
    d = s.decode
    active = ~d.done
    steps = jnp.max(s.plan)  # drafting stops at the longest plan; shorter plans are masked
    proposal = proposer.propose(draft_params, d, s.proposer_state, spec.num_speculative_tokens, steps)
    hidden, target_logprobs, cache = verify_forward(weights, d, proposal.tokens, cfg, proposer.feature_layers)
    verdict = verify(target_logprobs, proposal.logprobs, proposal.tokens, s.plan, d.sampling, d.lengths, spec.acceptance_rule)
    run = accepted_run(proposal.tokens, verdict)
    decode, emitted = append_run(dataclasses.replace(d, cache=cache), run, verdict.num_accepted + 1)
    pstate = proposer.after_verify(draft_params, proposal.state, hidden, verdict.num_accepted)
    counters = _count_round(s.counters, s.plan, verdict.num_accepted, emitted, active)
    adapt = _observe(s.adapt, verdict, jnp.minimum(s.available, steps), active, spec)
    adapt = dataclasses.replace(adapt, plain_run=jnp.int32(0))
    return dataclasses.replace(s, decode=decode, proposer_state=pstate, adapt=adapt, counters=counters)


def _plain_round(
    weights: Weights,
    draft_params: Any,
    s: SpecState,
    cfg: ModelConfig,
    proposer: Proposer,
    spec: SpeculativeConfig,
) -> SpecState:
    """An ordinary decode step; a stateful proposer sees its features (`after_plain`) and catches
    up on its tokens when speculation resumes (`resync`).

    A stateless proposer's first draft is scored against this step's distribution for free, so
    its acceptance estimate stays current while the loop decodes plainly.
    """
    d = s.decode
    rows = jnp.arange(d.lengths.shape[0])
    positions = d.lengths - 1
    tokens = d.tokens[rows, positions][:, None]
    layers = proposer.feature_layers
    hidden, features, cache = target_forward(weights, tokens, positions[:, None], d.cache, cfg, layers)
    logits = lm_logits(weights, hidden[:, 0])
    pstate = proposer.after_plain(draft_params, s.proposer_state, features)
    adapt = dataclasses.replace(s.adapt, plain_run=s.adapt.plain_run + 1)
    if spec.adaptive and not proposer.stateful:
        # The same draw as sampling.sample (same keys, same processed distribution), which also
        # scores the proposer's first draft for free.
        logprobs = sampled_logprobs(logits, d.sampling)
        new_tokens = draw(logprobs, d.sampling, position_keys(d.sampling, d.lengths[:, None])[:, 0])
        proposal = proposer.propose(draft_params, d, s.proposer_state, spec.num_speculative_tokens, jnp.int32(1))
        p_first = jnp.exp(jnp.take_along_axis(logprobs, proposal.tokens[:, :1], axis=-1)[:, 0])
        seen = jnp.zeros(adapt.observed.shape, bool).at[:, 0].set((s.available > 0) & ~d.done)
        adapt = _fold(adapt, jnp.broadcast_to(p_first[:, None], seen.shape), seen, spec)
    else:
        new_tokens = sample(logits, d.sampling, d.lengths)
    decode = append_tokens(dataclasses.replace(d, cache=cache), new_tokens)
    c = s.counters
    counters = dataclasses.replace(
        c,
        target_passes=c.target_passes + (~d.done).astype(jnp.int32),
        emitted=c.emitted + decode.lengths - d.lengths,
    )
    return dataclasses.replace(s, decode=decode, proposer_state=pstate, adapt=adapt, counters=counters)


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
    adapt: Adaptation, verdict: Verdict, drafted: jax.Array, active: jax.Array, spec: SpeculativeConfig
) -> Adaptation:
    """Fold this round's exact acceptance probabilities into the per-position moving averages.

    sum_v min(p, q) is P(accept) itself, a lower-variance signal than the accept/reject coin. At
    position i it is the conditional acceptance the plan needs whenever drafts before i were
    accepted, and it is measured even for sequences whose k is 0 (the draft still runs for the
    batch), so they can switch back on.
    """
    j = jnp.arange(verdict.expected_acceptance.shape[1])[None, :]
    valid = (j <= verdict.num_accepted[:, None]) & (j < drafted[:, None]) & active[:, None]
    return _fold(adapt, verdict.expected_acceptance, valid, spec)


def _fold(adapt: Adaptation, observed: jax.Array, seen: jax.Array, spec: SpeculativeConfig) -> Adaptation:
    """Average observations [B, K] in where seen [B, K]; the first few plainly, so the prior does not linger.

    Nothing else moves an estimate: every proposer is measured whenever it proposes (the draft in
    each round, n-gram lookup also in plain steps), so there is no need to drift back and retry.
    """
    count = adapt.observed + seen.astype(jnp.int32)
    weight = jnp.maximum(1.0 / jnp.maximum(count, 1), 1.0 - spec.acceptance_decay)
    updated = adapt.acceptance + weight * (observed - adapt.acceptance)
    return dataclasses.replace(adapt, acceptance=jnp.where(seen, updated, adapt.acceptance), observed=count)
