"""Exact (lossless) speculative acceptance, after Leviathan et al. and Chen et al. (2023).

Draft token x ~ q is accepted with probability min(1, p(x)/q(x)); the first rejected position
draws from norm(max(0, p - q)); if every drafted position is accepted a bonus token is drawn
from p. p and q are the processed distributions actually sampled from, so greedy rows (one-hot
p and q) reduce to "accept while the argmax agrees". Randomness comes from per-position keys
(seed + position), so a seeded request reproduces whatever else is in the batch.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from jaxinfer.sampling.sampler import SamplingArrays, first_argmax, processed_logprobs, skip_unless, step_keys

# fold_in tags: draft draws and acceptance uniforms use bits independent of the residual or
# bonus draw, which uses the untagged key plain sampling would use at that position.
DRAFT_TAG = 1
ACCEPT_TAG = 2


def exact_accept(p_x: jax.Array, q_x: jax.Array, u: jax.Array) -> jax.Array:
    """Accept with probability min(1, p(x)/q(x)) for uniforms u in [0, 1)."""
    return u * q_x < p_x


def exact_residual(p: jax.Array, q: jax.Array) -> jax.Array:
    """Unnormalised distribution to draw from after a rejection: max(0, p - q)."""
    return jnp.maximum(p - q, 0.0)


@dataclasses.dataclass(frozen=True)
class AcceptanceRule:
    """The two pieces of the rejection sampler, injectable so tests can prove broken ones fail."""

    accept: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] = exact_accept
    residual: Callable[[jax.Array, jax.Array], jax.Array] = exact_residual


EXACT_RULE = AcceptanceRule()


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Verdict:
    """Outcome of verifying one round of drafts."""

    num_accepted: jax.Array  # [B] int32 leading drafts accepted (<= k_eff)
    next_token: jax.Array  # [B] int32 correction (after a rejection) or bonus token
    expected_acceptance: jax.Array  # [B, K] float32 sum_v min(p, q): P(accept) at each draft position


def position_keys(params: SamplingArrays, positions: jax.Array, tag: int | None = None) -> jax.Array:
    """Keys [B, T, 2] for tokens at positions [B, T]; a tag derives an independent stream."""
    keys = jax.vmap(lambda pos: step_keys(params, pos), in_axes=1, out_axes=1)(positions)
    if tag is None:
        return keys
    return jax.vmap(jax.vmap(lambda k: jax.random.fold_in(k, tag)))(keys)


def sampled_logprobs(logits: jax.Array, params: SamplingArrays) -> jax.Array:
    """processed_logprobs [N, V], skipping the softmax work when every row is greedy (one-hot)."""
    return skip_unless(
        ~jnp.all(params.temperature <= 0),
        lambda: processed_logprobs(logits, params),
        lambda: one_hot_logprobs(first_argmax(logits), logits.shape[-1]),
        params.branchless,
    )


def one_hot_logprobs(tokens: jax.Array, vocab: int) -> jax.Array:
    """Log of a point mass [..., V] at each token: q for deterministic proposers, p for greedy rows."""
    return jnp.where(jax.nn.one_hot(tokens, vocab, dtype=jnp.float32) > 0, 0.0, -jnp.inf)


def draw(logprobs: jax.Array, params: SamplingArrays, keys: jax.Array) -> jax.Array:
    """Tokens [B] from logprobs [B, V]; an all-greedy batch (one-hot rows) skips the random bits."""
    greedy = params.temperature <= 0
    argmax = first_argmax(logprobs)

    def sampled() -> jax.Array:
        return jax.vmap(jax.random.categorical)(keys, logprobs).astype(jnp.int32)

    drawn = skip_unless(~jnp.all(greedy), sampled, lambda: argmax, params.branchless)
    return jnp.where(greedy, argmax, drawn)


def verify(
    target_logprobs: jax.Array,
    draft_logprobs: jax.Array | None,
    draft_tokens: jax.Array,
    k_eff: jax.Array,
    params: SamplingArrays,
    first_position: jax.Array,
    rule: AcceptanceRule = EXACT_RULE,
) -> Verdict:
    """Accept/reject drafts [B, K] (draft token i sits at first_position + i).

    target_logprobs [B, K+1, V] are p at every draft position plus the bonus one, draft_logprobs
    [B, K, V] are q, or None for a deterministic proposer: q one-hot at the drafts, so q(x) = 1 and
    sum_v min(p, q) = p(x), and no [B, K, V] array of it is made (only the [B, V] row the residual
    needs); positions at or past k_eff [B] count as not drafted (adaptive length).
    """
    batch, k = draft_tokens.shape
    rows = jnp.arange(batch)
    p = jnp.exp(target_logprobs)
    p_x = jnp.take_along_axis(p[:, :k], draft_tokens[..., None], axis=-1)[..., 0]
    if draft_logprobs is None:
        q, q_x, expected = None, jnp.ones_like(p_x), p_x
    else:
        q = jnp.exp(draft_logprobs)
        q_x = jnp.take_along_axis(q, draft_tokens[..., None], axis=-1)[..., 0]
        expected = jnp.sum(jnp.minimum(p[:, :k], q), axis=-1)
    positions = first_position[:, None] + jnp.arange(k + 1, dtype=jnp.int32)[None, :]
    accept_keys = position_keys(params, positions[:, :k], ACCEPT_TAG)
    u = jax.vmap(jax.vmap(jax.random.uniform))(accept_keys)
    drafted = jnp.arange(k)[None, :] < k_eff[:, None]
    accepted = rule.accept(p_x, q_x, u) & drafted
    num_accepted = jnp.sum(jnp.cumprod(accepted, axis=-1), axis=-1).astype(jnp.int32)
    last = jnp.minimum(num_accepted, k - 1)  # the rejected position (the last one when none was)
    q_n = jax.nn.one_hot(draft_tokens[rows, last], p.shape[-1], dtype=p.dtype) if q is None else q[rows, last]
    next_token = _correction_or_bonus(target_logprobs, q_n, num_accepted, k_eff, params, positions, rule)
    return Verdict(num_accepted, next_token, expected)


def repeat_rows(params: SamplingArrays, times: int) -> SamplingArrays:
    """Each row's sampling parameters repeated `times` times (one per verified position)."""
    return jax.tree.map(lambda x: jnp.repeat(x, times, axis=0), params)


def verify_logits(
    logits: jax.Array,
    draft_logprobs: jax.Array | None,
    draft_tokens: jax.Array,
    k_eff: jax.Array,
    params: SamplingArrays,
    first_position: jax.Array,
    rule: AcceptanceRule = EXACT_RULE,
) -> Verdict:
    """`verify` from the target's logits [B, K+1, V] (bias and masks applied): p is their processed
    distribution. draft_logprobs [B, K, V] is q, or None for a deterministic proposer (one-hot q at
    the drafts: see `verify`).

    A batch of greedy rows only takes each position's argmax: its drafts are kept while they equal
    it, and the token after them is the argmax there, which is what the exact rule reduces to for a
    one-hot p (a broken `rule` is seen by sampled rows only). A program with conditionals skips the
    [B, K+1, V] work of the sampled path then; a branchless one always runs the sampled path.
    """
    batch, positions, vocab = logits.shape

    def sampled() -> Verdict:
        flat = logits.reshape(batch * positions, vocab)
        target = sampled_logprobs(flat, repeat_rows(params, positions)).reshape(batch, positions, vocab)
        return verify(target, draft_logprobs, draft_tokens, k_eff, params, first_position, rule)

    def greedy() -> Verdict:
        return greedy_verdict(first_argmax(logits), draft_logprobs, draft_tokens, k_eff)

    return skip_unless(~jnp.all(params.temperature <= 0), sampled, greedy, params.branchless)


def greedy_verdict(
    best: jax.Array, draft_logprobs: jax.Array | None, draft_tokens: jax.Array, k_eff: jax.Array
) -> Verdict:
    """The exact rule's verdict for greedy rows from each position's argmax best [B, K+1]: the leading
    drafts equal to it, then its token; P(accept) is q at the argmax (1 or 0 for a one-hot q)."""
    batch, k = draft_tokens.shape
    matches = best[:, :k] == draft_tokens
    agrees = matches & (jnp.arange(k)[None, :] < k_eff[:, None])
    num_accepted = jnp.sum(jnp.cumprod(agrees, axis=-1), axis=-1).astype(jnp.int32)
    if draft_logprobs is None:
        expected = matches.astype(jnp.float32)
    else:
        expected = jnp.exp(jnp.take_along_axis(draft_logprobs, best[:, :k, None], axis=-1)[..., 0])
    return Verdict(num_accepted, best[jnp.arange(batch), num_accepted], expected)


def _correction_or_bonus(
    target_logprobs: jax.Array,
    q_n: jax.Array,
    num_accepted: jax.Array,
    k_eff: jax.Array,
    params: SamplingArrays,
    positions: jax.Array,
    rule: AcceptanceRule,
) -> jax.Array:
    """Token at position first + n: from the residual after a rejection (q_n [B, V]: q at the
    rejected position), else (bonus) from p."""
    rows = jnp.arange(q_n.shape[0])
    n = num_accepted
    p_n_log = target_logprobs[rows, n]
    rejected = n < k_eff
    residual = rule.residual(jnp.exp(p_n_log), q_n)
    # p == q up to rounding can leave no mass; then p itself is the exact answer.
    usable = rejected & (jnp.sum(residual, axis=-1) > 0)
    log_r = jnp.where(usable[:, None], jnp.log(residual), p_n_log)
    keys = position_keys(params, positions[rows, n][:, None])[:, 0]
    return draw(log_r, params, keys)
