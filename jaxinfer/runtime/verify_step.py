"""The serving engine's speculative step: verify host-proposed drafts for every row in one pass.

Each row is laid out as a prefill chunk of `[last token, draft_1 .. draft_k]` (right-padded to
the step's chunk), so the ragged step's forward writes their K/V and yields the target's
distribution at every position. Acceptance is the exact rule of `speculative.rejection`: prompt
lookup is deterministic, so q is one-hot and draft i is kept with probability p(draft_i); a
draft model (`runtime/draft_model_rider`), an EAGLE head (`runtime/eagle_rider`) or a Gemma 4 assistant
(`runtime/assistant_rider`, over the target's pages) drafts here first and its processed distributions are q. Greedy
rows keep drafts while they equal the argmax. K/V written for rejected drafts
sit past the row's new length and are overwritten by later steps.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, lm_logits
from jaxinfer.runtime import assistant_rider, eagle_rider, ngram_rider
from jaxinfer.runtime.assistant_rider import AssistantDraft
from jaxinfer.runtime.draft_model_rider import catch_up, propose
from jaxinfer.runtime.eagle_rider import EagleDraft
from jaxinfer.runtime.engine_step import (
    MAX_LOGPROBS,
    Rider,
    RowSampling,
    StepInputs,
    StepOutputs,
    feature_taps,
    mask_early_stops,
    row_logprobs,
)
from jaxinfer.runtime.flat_forward import DraftModel, step_features
from jaxinfer.runtime.ngram_rider import NgramDraft
from jaxinfer.sampling.penalties import add_logit_bias
from jaxinfer.sampling.token_bitmask import apply_token_bitmask
from jaxinfer.speculative.rejection import EXACT_RULE, AcceptanceRule, verify_logits


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Drafts:
    """Each row's proposed continuation."""

    tokens: jax.Array  # [R, C - 1] int32, zero past count
    count: jax.Array  # [R] int32 drafts to verify (0: the row decodes plainly)


def position_logits(raw: jax.Array, x: StepInputs, rows: int) -> jax.Array:
    """Float32 logits [R, C, V] at every verified position from the model's [R * C, V]: logit bias
    added, stop ids masked before min_tokens, each position's structured-output mask applied."""
    chunk = raw.shape[0] // rows
    logits = raw.astype(jnp.float32)
    first_next = x.lengths - x.query_lens + 1  # index of the token the row's first query predicts
    next_index = (first_next[:, None] + jnp.arange(chunk, dtype=jnp.int32)[None, :]).reshape(-1)
    s = x.sampling
    repeat = lambda a: jnp.repeat(a, chunk, axis=0)  # noqa: E731
    biased = add_logit_bias(logits, repeat(s.bias_ids), repeat(s.bias))
    masked = mask_early_stops(biased, repeat(s.stop_ids), repeat(s.min_lengths), next_index)
    return apply_token_bitmask(masked, s.bitmask).reshape(rows, chunk, -1)


def verify_step(
    weights: Weights, pages: PagedKVCache, x: StepInputs, drafts: Drafts, cfg: ModelConfig,
    rule: AcceptanceRule = EXACT_RULE, draft: Rider = None, draft_weights=None,
) -> tuple[StepOutputs, PagedKVCache, Rider]:
    """Accepted drafts then one corrected (or bonus) token per row: tokens [R, C], counts = accepted + 1.

    x holds no penalized rows (they decode plainly); every row is one verify chunk.
    With a draft model or an EAGLE head, drafts.tokens are placeholders: it proposes
    drafts.count tokens per row here; otherwise they are the host's (prompt lookup) with one-hot q.
    """
    rows = x.lengths.shape[0]
    chunk = x.tokens.shape[0] // rows
    if isinstance(draft, NgramDraft):  # looked up here: a row verifies the drafts it found
        x, drafts, draft = _looked_up(draft, x, drafts)
    proposal = None  # a deterministic proposer's (prompt lookup): one-hot at its drafts
    if isinstance(draft, AssistantDraft):  # it reads the target's pages: the keys before each row's last token
        tokens, proposal = assistant_rider.propose(draft, draft_weights, pages, x, drafts.count)
        drafts = dataclasses.replace(drafts, tokens=tokens)
        x = dataclasses.replace(x, tokens=with_drafts(x.tokens, tokens))
    elif draft is not None and not isinstance(draft, NgramDraft):
        drafter = eagle_rider.propose if isinstance(draft, EagleDraft) else propose
        tokens, proposal, draft = drafter(draft, draft_weights, x, drafts.count)
        drafts = dataclasses.replace(drafts, tokens=tokens)
        x = dataclasses.replace(x, tokens=with_drafts(x.tokens, tokens))
    hidden, features, pages = step_features(weights, pages, x, cfg, feature_taps(draft))
    raw = lm_logits(weights, hidden)
    logits = position_logits(raw, x, rows)
    first_position = x.lengths - drafts.count
    verdict = verify_logits(logits, proposal, drafts.tokens, drafts.count, x.sampling.params, first_position, rule)
    n = verdict.num_accepted
    columns = jnp.arange(chunk, dtype=jnp.int32)[None, :]
    padded = jnp.pad(drafts.tokens, ((0, 0), (0, 1)))
    tokens = jnp.where(columns < n[:, None], padded, verdict.next_token[:, None])
    if isinstance(draft, EagleDraft):
        draft = eagle_rider.rewrite(draft, draft_weights, x, features, tokens, n + 1)
    elif isinstance(draft, AssistantDraft):  # a rejected draft's state is rewritten before P - 1 reaches it
        draft = assistant_rider.remember(draft, x, features)
    chosen, ids, values, ranks = position_logprobs(raw, tokens, x.sampling)
    return StepOutputs(tokens, n + 1, chosen, ids, values, drafted=drafts.count, ranks=ranks), pages, draft


def position_logprobs(raw: jax.Array, tokens: jax.Array, s: RowSampling) -> tuple[jax.Array, ...]:
    """`row_logprobs` at every verified position: of tokens [R, C] under the raw logits [R * C, V]
    (the model's distribution, as plain steps report it), each result [R, C, ...]."""
    rows, chunk = tokens.shape
    flat = row_logprobs(raw, tokens.reshape(-1), s)
    return tuple(a.reshape(rows, chunk, *a.shape[1:]) for a in flat)


def _looked_up(draft: NgramDraft, x: StepInputs, drafts: Drafts) -> tuple[StepInputs, Drafts, NgramDraft]:
    """The verify layout with each row's chunk cut to the drafts the device's lookup found (at most
    drafts.count), those drafts, and the pool with the chunk's tokens stored (rejected drafts land
    past the row's new length, where nothing reads them before they are overwritten)."""
    rows = x.lengths.shape[0]
    chunk = x.tokens.shape[0] // rows
    tokens, found = ngram_rider.propose(draft, x, drafts.count)
    x = next_round(x, x.tokens[::chunk], x.lengths - x.query_lens, found, x.query_lens > 0)
    x = dataclasses.replace(x, tokens=with_drafts(x.tokens, tokens))
    return x, Drafts(tokens, found), ngram_rider.store(draft, x)


def with_drafts(flat: jax.Array, drafts: jax.Array) -> jax.Array:
    """Flat verify tokens [R * C] with each row's slots 1.. replaced by its drafts [R, C - 1]."""
    rows = drafts.shape[0]
    grid = flat.reshape(rows, -1)
    return jnp.concatenate([grid[:, :1], drafts], axis=1).reshape(-1)


def verify_rounds(
    weights: Weights, pages: PagedKVCache, x: StepInputs, drafts: Drafts, num_rounds: jax.Array,
    capacity: jax.Array, window: jax.Array, draft_start: jax.Array, cfg: ModelConfig, max_rounds: int,
    rule: AcceptanceRule = EXACT_RULE, draft: Rider = None, draft_weights=None,
) -> tuple[StepOutputs, PagedKVCache, Rider]:
    """Up to num_rounds (<= max_rounds) verify steps in a while_loop: tokens [R, max_rounds * C]
    (each row's emitted tokens, packed), counts, and the drafts and acceptances of every round.

    After the first round (x and drafts as `verify_step` takes them) each row drafts again from
    its new last token on the device (a draft model or EAGLE head: host drafts last one round),
    as many tokens as drafts.count, fewer near max_tokens. The loop returns to the host when a
    row emits a stop id or reaches its length, or when another round would write past the pages
    reserved for a row (capacity [R], tokens), so new arrivals and finished rows wait at most one call.
    A draft model or head first reads the positions from draft_start [R] on (window [R, CATCH_UP_WINDOW]:
    each row's tokens from there; see flat_forward.catch_up_span).
    """
    rows = x.lengths.shape[0]
    chunk = x.tokens.shape[0] // rows
    index, columns = jnp.arange(rows), jnp.arange(chunk, dtype=jnp.int32)[None, :]
    live = x.query_lens > 0
    s = x.sampling

    def body(carry: tuple) -> tuple:
        i, x, drafts, pages, draft, out, _ = carry
        step, pages, draft = verify_step(weights, pages, x, drafts, cfg, rule, draft, draft_weights)
        emitted = step.counts
        kept = live[:, None] & (columns < emitted[:, None])
        out = _recorded(out, step, i, live, kept)
        last_position = x.lengths - x.query_lens + emitted  # of the row's new last token
        stopped = jnp.any(kept[:, :, None] & (step.tokens[:, :, None] == s.stop_ids[:, None, :]), axis=(1, 2))
        finished = stopped | (last_position + 1 >= s.max_lengths)
        full = last_position + chunk > capacity
        count = jnp.clip(jnp.minimum(drafts.count, s.max_lengths - last_position - 2), 0)
        x = next_round(x, step.tokens[index, emitted - 1], last_position, count, live)
        halt = jnp.any(live & (finished | full))
        return i + 1, x, Drafts(jnp.zeros_like(drafts.tokens), count), pages, draft, out, halt

    empty = _no_outputs(rows, chunk, max_rounds)
    if isinstance(draft, DraftModel):
        draft = catch_up(draft, draft_weights, x, window, draft_start)
    elif isinstance(draft, EagleDraft):
        draft = eagle_rider.catch_up(draft, draft_weights, x, window, draft_start)
    carry = (jnp.int32(0), x, drafts, pages, draft, empty, ~jnp.any(live))  # every row finished ahead: no round
    if s.params.branchless:
        carry = jax.lax.fori_loop(0, max_rounds, lambda _, c: _unless_halted(c, body, num_rounds), carry)
    else:
        carry = jax.lax.while_loop(lambda c: (c[0] < num_rounds) & ~c[-1], body, carry)
    return carry[5], carry[3], carry[4]


def _no_outputs(rows: int, chunk: int, max_rounds: int) -> StepOutputs:
    """The packed outputs of a call before its first round: room for max_rounds rounds of chunk tokens a row."""
    width = max_rounds * chunk
    return StepOutputs(
        jnp.zeros((rows, width), jnp.int32), jnp.zeros((rows,), jnp.int32), jnp.zeros((rows, width)),
        jnp.zeros((rows, width, MAX_LOGPROBS), jnp.int32), jnp.zeros((rows, width, MAX_LOGPROBS)),
        drafted=jnp.full((rows, max_rounds), -1, jnp.int32), accepted=jnp.zeros((rows, max_rounds), jnp.int32),
        ranks=jnp.ones((rows, width), jnp.int32),
    )


def _recorded(out: StepOutputs, step: StepOutputs, i: jax.Array, live: jax.Array, kept: jax.Array) -> StepOutputs:
    """out with round i's step appended: each live row's kept tokens (and their logprobs) packed after
    the ones before, its drafts and acceptances in column i."""
    rows, width = out.tokens.shape
    columns = jnp.arange(kept.shape[1], dtype=jnp.int32)[None, :]
    slots = jnp.where(kept, out.counts[:, None] + columns, width)
    put = lambda packed, new: packed.at[jnp.arange(rows)[:, None], slots].set(new, mode="drop")  # noqa: E731
    return dataclasses.replace(
        out, tokens=put(out.tokens, step.tokens), logprobs=put(out.logprobs, step.logprobs),
        top_ids=put(out.top_ids, step.top_ids), top_logprobs=put(out.top_logprobs, step.top_logprobs),
        ranks=put(out.ranks, step.ranks), counts=out.counts + jnp.where(live, step.counts, 0),
        drafted=out.drafted.at[:, i].set(jnp.where(live, step.drafted, -1)),
        accepted=out.accepted.at[:, i].set(jnp.where(live, step.counts - 1, 0)),
    )


def _unless_halted(carry: tuple, body, num_rounds: jax.Array) -> tuple:
    """One round of a fixed-trip loop: a round after the loop halted (or past num_rounds) runs again
    on the same inputs and keeps nothing but its pool writes, which repeat the last round's.

    A GPU then queues every round without reading a continue-test back; the rounds it did not
    need cost their compute, as finished rows in a multi-step decode call do.
    """
    stopped = carry[-1] | (carry[0] >= num_rounds)
    new = body(carry)
    keep = lambda old, fresh: jax.tree.map(lambda a, b: jnp.where(stopped, a, b), old, fresh)  # noqa: E731
    return (carry[0] + 1, keep(carry[1], new[1]), keep(carry[2], new[2]), new[3], new[4], keep(carry[5], new[5]),
            stopped | new[6])


def next_round(
    x: StepInputs, last: jax.Array, last_position: jax.Array, count: jax.Array, live: jax.Array
) -> StepInputs:
    """The next round's verify layout: each live row's chunk `[last token, count placeholders]` at last_position."""
    rows = last.shape[0]
    chunk = x.tokens.shape[0] // rows
    columns = jnp.arange(chunk, dtype=jnp.int32)[None, :]
    in_chunk = live[:, None] & (columns <= count[:, None])
    grid = jnp.zeros((rows, chunk), jnp.int32).at[:, 0].set(last)
    return dataclasses.replace(
        x, tokens=grid.reshape(-1), positions=jnp.where(in_chunk, last_position[:, None] + columns, -1).reshape(-1),
        lengths=jnp.where(live, last_position + 1 + count, x.lengths), query_lens=jnp.where(live, 1 + count, 0),
    )
