"""The rejection sampler in isolation: exactness on synthetic distributions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxinfer import SamplingParams
from jaxinfer.sampling.sampler import SamplingArrays, sampling_arrays
from jaxinfer.speculative.rejection import (
    EXACT_RULE,
    AcceptanceRule,
    exact_accept,
    exact_residual,
    one_hot_logprobs,
    verify,
    verify_logits,
)

ROWS, VOCAB, K = 20000, 6, 2
P = np.array([[0.35, 0.25, 0.2, 0.1, 0.1, 0.0], [0.05, 0.05, 0.1, 0.2, 0.3, 0.3], [1 / 6] * 6])
Q = np.array([[0.1, 0.1, 0.1, 0.2, 0.2, 0.3], [0.3, 0.3, 0.2, 0.1, 0.1, 0.0]])


def sampled_params(rows: int) -> SamplingArrays:
    keys = jax.vmap(lambda s: jax.random.key_data(jax.random.PRNGKey(s)))(jnp.arange(rows))
    ones = jnp.ones(rows, jnp.float32)
    return SamplingArrays(ones, jnp.zeros(rows, jnp.int32), ones, 0 * ones, keys.astype(jnp.uint32))


def run_verify(rule: AcceptanceRule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draft from Q, verify against P for ROWS independent rows; returns drafts, n, next token."""
    params = sampled_params(ROWS)
    q_log = jnp.log(jnp.broadcast_to(jnp.asarray(Q, jnp.float32), (ROWS, K, VOCAB)))
    p_log = jnp.log(jnp.broadcast_to(jnp.asarray(P, jnp.float32), (ROWS, K + 1, VOCAB)))
    draft_keys = jax.random.split(jax.random.PRNGKey(123), ROWS * K).reshape(ROWS, K, -1)
    drafts = jax.vmap(jax.vmap(jax.random.categorical))(draft_keys, q_log).astype(jnp.int32)
    k_eff = jnp.full((ROWS,), K, jnp.int32)
    start = jnp.full((ROWS,), 10, jnp.int32)
    v = jax.jit(verify, static_argnames=("rule",))(p_log, q_log, drafts, k_eff, params, start, rule=rule)
    return np.asarray(drafts), np.asarray(v.num_accepted), np.asarray(v.next_token)


def chi2_pvalue(tokens: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit of observed tokens to probs (bins with no mass must stay empty)."""
    counts = np.bincount(tokens, minlength=len(probs))
    if np.any(counts[probs == 0]):
        return 0.0
    keep = probs > 0
    return stats.chisquare(counts[keep], probs[keep] * len(tokens)).pvalue


def emitted(drafts: np.ndarray, n: np.ndarray, nxt: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray]:
    """Token the round emits at draft position `position`, for rows that reached it."""
    reached = n >= position
    token = np.where(n[reached] > position, drafts[reached, position], nxt[reached])
    return token, reached


def test_exact_rule_reproduces_target_distribution():
    drafts, n, nxt = run_verify(EXACT_RULE)
    first, _ = emitted(drafts, n, nxt, 0)
    second, reached = emitted(drafts, n, nxt, 1)
    assert chi2_pvalue(first, P[0]) > 1e-3
    assert chi2_pvalue(second, P[1]) > 1e-3
    assert reached.sum() > 2000  # the accept path really was exercised


@pytest.mark.parametrize(
    "rule",
    [
        AcceptanceRule(accept=lambda p, q, u: jnp.ones_like(u, bool), residual=exact_residual),
        AcceptanceRule(accept=exact_accept, residual=lambda p, q: p),
        AcceptanceRule(accept=lambda p, q, u: u < p, residual=exact_residual),
    ],
    ids=["always-accept", "resample-from-p", "ignore-q"],
)
def test_broken_rules_are_detected(rule):
    drafts, n, nxt = run_verify(rule)
    first, _ = emitted(drafts, n, nxt, 0)
    assert chi2_pvalue(first, P[0]) < 1e-6


def test_greedy_accepts_while_argmax_agrees():
    one_hot = lambda ids: jnp.log(jax.nn.one_hot(jnp.asarray(ids), 5))  # noqa: E731
    params = sampled_params(2)
    params = SamplingArrays(0 * params.temperature, params.top_k, params.top_p, params.min_p, params.keys)
    target = jnp.stack([one_hot([1, 2, 3, 4]), one_hot([1, 0, 3, 4])])  # row 1 disagrees at position 1
    drafts = jnp.asarray([[1, 2, 3], [1, 2, 3]], jnp.int32)
    draft_lp = jnp.stack([one_hot([1, 2, 3])] * 2)
    k_eff = jnp.asarray([3, 3], jnp.int32)
    v = verify(target, draft_lp, drafts, k_eff, params, jnp.asarray([5, 5], jnp.int32))
    assert v.num_accepted.tolist() == [3, 1]
    assert v.next_token.tolist() == [4, 0]  # bonus from p, then the target's correction
    assert np.asarray(v.expected_acceptance).tolist() == [[1, 1, 1], [1, 0, 1]]


def test_effective_length_masks_later_drafts():
    params = sampled_params(1)
    p = jnp.log(jnp.asarray([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]]))
    drafts = jnp.asarray([[1, 2]], jnp.int32)
    v = verify(p, p[:, :2], drafts, jnp.asarray([1], jnp.int32), params, jnp.asarray([3], jnp.int32))
    assert int(v.num_accepted[0]) == 1
    assert int(v.next_token[0]) == 2  # drawn from p at position 1 (a bonus), not the masked draft check


@pytest.mark.parametrize("proposer", ["one-hot", "distribution"])
def test_greedy_batches_take_the_argmax_path_with_the_exact_rules_verdict(proposer):
    """verify_logits with conditionals skips the sampled path for an all-greedy batch; a branchless
    program always runs it: both give the same verdict."""
    rows, k, vocab = 64, 4, 50
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.standard_normal((rows, k + 1, vocab)), jnp.float32)
    best = np.asarray(jnp.argmax(logits, axis=-1))
    agree = rng.random((rows, k)) < 0.7  # most drafts the argmax, some not: every accepted count occurs
    drafts = jnp.asarray(np.where(agree, best[:, :k], (best[:, :k] + 1) % vocab), jnp.int32)
    k_eff = jnp.asarray(rng.integers(0, k + 1, rows), jnp.int32)
    q = None if proposer == "one-hot" else jax.nn.log_softmax(jnp.asarray(rng.standard_normal((rows, k, vocab))))
    start = jnp.full((rows,), 7, jnp.int32)

    def verdict(branchless: bool):
        params = sampling_arrays([SamplingParams(temperature=0.0)] * rows, list(range(rows)), branchless)
        return jax.jit(verify_logits)(logits, q, drafts, k_eff, jax.tree.map(jnp.asarray, params), start)

    argmax_path, sampled_path = verdict(branchless=False), verdict(branchless=True)
    assert len(set(np.asarray(argmax_path.num_accepted).tolist())) == k + 1
    for field in ("num_accepted", "next_token", "expected_acceptance"):
        np.testing.assert_allclose(getattr(argmax_path, field), getattr(sampled_path, field), rtol=1e-6, err_msg=field)


def test_a_deterministic_proposer_needs_no_q_arrays_and_gets_the_same_verdict():
    """verify with draft_logprobs None (one-hot q at the drafts, never built whole) against the same
    one-hot q passed in full, on sampled rows: identical draws, corrections and P(accept)."""
    rows, k, vocab = 4000, 3, 7
    rng = np.random.default_rng(1)
    target = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((rows, k + 1, vocab)) * 2, jnp.float32))
    drafts = jnp.asarray(rng.integers(0, vocab, (rows, k)), jnp.int32)
    k_eff = jnp.asarray(rng.integers(0, k + 1, rows), jnp.int32)
    params, start = sampled_params(rows), jnp.full((rows,), 3, jnp.int32)
    run = jax.jit(verify)
    implicit = run(target, None, drafts, k_eff, params, start)
    explicit = run(target, one_hot_logprobs(drafts, vocab), drafts, k_eff, params, start)
    assert len(set(np.asarray(implicit.num_accepted).tolist())) == k + 1
    for field in ("num_accepted", "next_token", "expected_acceptance"):
        np.testing.assert_array_equal(getattr(implicit, field), getattr(explicit, field), err_msg=field)
