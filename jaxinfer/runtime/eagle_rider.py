"""An EAGLE head speculating inside the serving engine.

The head keeps three pools indexed by the target's page tables (same page ids, so the block
manager's allocation, prefix sharing and preemption hold for them): its one layer's K/V, the
target's features at every position, and its own output at every position (`predicted`: at
position p the head reads (f_p, t_{p+1}) and its output predicts f_{p+1}, whose logits give
t_{p+2}). Ragged steps (prefill chunks) run the head over their tokens (`head_reads`), t_{p+1}
being the host's next known token or the one the step sampled; plain multi-step decode calls
only store their features (a head pass per step would slow plain decoding while speculation is
off), and the next verify step first runs the head over the positions it missed (`catch_up`).
A verify step drafts from the stored output at L-2 (L tokens known), chains on the head's own
predictions, and after acceptance runs the head again over the verified positions with the
target's true features (`rewrite`), replacing what the chain wrote there. Entries past a
sequence's end are rewritten before any query can see them, as in the target's cache.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.runtime.flat_forward import catch_up_inputs, catch_up_span, decode_inputs, step_view, window_tokens
from jaxinfer.runtime.host_step import CATCH_UP_CHUNK, CATCH_UP_ROUNDS
from jaxinfer.runtime.position_pool import pool_index, store_at
from jaxinfer.speculative.eagle import EagleConfig, EagleParams, head_logits, head_step, project_features
from jaxinfer.speculative.rejection import DRAFT_TAG, draw, position_keys, sampled_logprobs

if TYPE_CHECKING:
    from jaxinfer.runtime.engine_step import StepInputs


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EagleDraft:
    """The head's pools; its weights (with the target's embedding and LM head) travel beside it."""

    pages: PagedKVCache  # the head layer's K/V
    # Per position: [pages, page_size, D] the head's output and [pages, page_size, F] the target's
    # features; float32 on CPU (XLA:CPU widens a 16-bit scatter and copies the whole buffer per
    # write, a float32 one it updates in place), the model's dtype elsewhere.
    predicted: jax.Array
    features: jax.Array
    ecfg: EagleConfig = dataclasses.field(metadata=dict(static=True))
    dtype: str = dataclasses.field(metadata=dict(static=True))  # the head's compute dtype


def _load(head: EagleDraft, pool: jax.Array, table: jax.Array, positions: jax.Array) -> jax.Array:
    page, slot = pool_index(pool, table, positions)
    return pool[page, slot].astype(head.dtype)


def remember(head: EagleDraft, x: "StepInputs", features: jax.Array) -> EagleDraft:
    """The head with the target's features [N, F] of x's flat tokens stored (for a later `catch_up`)."""
    stored = store_at(head.features, x.page_table[x.token_rows], x.positions, features)
    return dataclasses.replace(head, features=stored)


def _head_pass(
    head: EagleDraft, params: EagleParams, x: "StepInputs", features: jax.Array, next_tokens: jax.Array
) -> tuple[jax.Array, EagleDraft]:
    """The head over x's flat tokens reading (features [N, F], next_tokens [N]) at x.positions;
    its K/V and outputs [N, D] are stored, padding (position -1) writes nothing."""
    inputs = project_features(params, features.astype(head.dtype), head.ecfg)
    predicted, view = head_step(
        params, next_tokens[None], inputs[None], x.positions[None], step_view(head.pages, x), head.ecfg
    )
    pages = dataclasses.replace(view.pages, page_table=head.pages.page_table)
    stored = store_at(head.predicted, x.page_table[x.token_rows], x.positions, predicted[0])
    return predicted[0], dataclasses.replace(head, pages=pages, predicted=stored)


def head_reads(
    head: EagleDraft, params: EagleParams, x: "StepInputs", features: jax.Array, sampled: jax.Array
) -> EagleDraft:
    """The head after a ragged step: every flat token p reads (f_p, t_{p+1}), t_{p+1} the host's
    (x.next_tokens) where known, else the token the step sampled for its row (sampled [R])."""
    next_tokens = jnp.where(x.next_tokens >= 0, x.next_tokens, sampled[x.token_rows])
    return _head_pass(remember(head, x, features), params, x, features, next_tokens)[1]


def catch_up(
    head: EagleDraft, params: EagleParams, x: "StepInputs", window: jax.Array, start: jax.Array
) -> EagleDraft:
    """The head over positions start .. L-2 of each row from the stored features, before a verify
    step drafts, at most CATCH_UP_SPAN of them (x: its layout, L-1 each row's last position;
    window [R, CATCH_UP_WINDOW]: each row's tokens from start on)."""
    begin, end = catch_up_span(x, start)
    index = jnp.arange(CATCH_UP_CHUNK, dtype=jnp.int32)

    def step(carry: tuple) -> tuple:
        begin, head = carry
        following = window_tokens(window, start, begin[:, None] + index[None, :] + 1)
        inputs = catch_up_inputs(x, begin, end, CATCH_UP_CHUNK)
        table = inputs.page_table[inputs.token_rows]
        features = _load(head, head.features, table, inputs.positions)
        _, head = _head_pass(head, params, inputs, features, following.reshape(-1))
        return begin + CATCH_UP_CHUNK, head

    carry = (begin, head)
    if x.sampling.params.branchless:  # caught-up rows' chunks are padding: they write nothing
        return jax.lax.fori_loop(0, CATCH_UP_ROUNDS, lambda _, c: step(c), carry)[1]
    return jax.lax.while_loop(lambda c: jnp.any(c[0] < end), step, carry)[1]


def propose(
    head: EagleDraft, params: EagleParams, x: "StepInputs", count: jax.Array
) -> tuple[jax.Array, jax.Array, EagleDraft]:
    """Drafts [R, C-1], their processed distributions [R, C-1, V] and the head with the chain's K/V.

    x is the verify layout (every row one chunk of C tokens starting with its last token, at L-1);
    row r drafts count[r] tokens: the first from the head's stored output at L-2, each next one
    from the head at the previous draft's position reading the prediction and that draft.
    """
    rows = x.lengths.shape[0]
    chunk = x.tokens.shape[0] // rows
    start = x.lengths - x.query_lens  # position of each row's last token
    live_rows = x.query_lens > 0
    params_s = x.sampling.params
    vocab = head.ecfg.layer.vocab_size

    def draft_at(feature: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
        q = sampled_logprobs(head_logits(params, feature, head.ecfg), params_s)
        keys = position_keys(params_s, (start + i + 1)[:, None], DRAFT_TAG)[:, 0]
        return draw(q, params_s, keys), q

    def record(tokens, logprobs, i, token, q):
        wanted = (i < count)[:, None]
        slot = jnp.minimum(i, chunk - 2)
        tokens = tokens.at[:, slot].set(jnp.where(wanted[:, 0], token, tokens[:, slot]))
        return tokens, logprobs.at[:, slot].set(jnp.where(wanted, q, logprobs[:, slot]))

    feature = _load(head, head.predicted, x.page_table, jnp.maximum(start - 1, 0))  # the head at L-2: f_{L-1}
    token, q = draft_at(feature, jnp.int32(0))
    tokens, logprobs = record(
        jnp.zeros((rows, chunk - 1), jnp.int32), jnp.full((rows, chunk - 1, vocab), -jnp.inf, jnp.float32),
        jnp.int32(0), token, q,
    )

    def step(carry: tuple) -> tuple:
        i, pages, feature, token, tokens, logprobs = carry
        inputs = decode_inputs(x, token, start + i - 1, live_rows & (i < count))
        out, view = head_step(params, token[None], feature[None], inputs.positions[None],
                              step_view(pages, inputs), head.ecfg)
        pages = dataclasses.replace(view.pages, page_table=head.pages.page_table)
        token, q = draft_at(out[0], i)
        tokens, logprobs = record(tokens, logprobs, i, token, q)
        return i + 1, pages, out[0], token, tokens, logprobs

    calls = jnp.max(jnp.where(live_rows, count, 0))
    carry = (jnp.int32(1), head.pages, feature, token, tokens, logprobs)
    if x.sampling.params.branchless:  # calls past a row's count are padding (position -1)
        carry = jax.lax.fori_loop(1, chunk - 1, lambda _, c: step(c), carry)
    else:
        carry = jax.lax.while_loop(lambda c: c[0] < calls, step, carry)
    _, pages, _, _, tokens, logprobs = carry
    return tokens, logprobs, dataclasses.replace(head, pages=pages)


def rewrite(
    head: EagleDraft, params: EagleParams, x: "StepInputs", features: jax.Array, emitted: jax.Array,
    counts: jax.Array,
) -> EagleDraft:
    """The head over each row's verified positions with the target's features [R*C, F]: position
    L-1+j reads emitted[r, j] (the accepted drafts, then the corrected or bonus token) for
    j < counts[r]; what the chain wrote from predicted features there is replaced, and the features stored."""
    rows = counts.shape[0]
    chunk = emitted.shape[1]
    start = x.lengths - x.query_lens
    live = x.query_lens > 0
    kept = live[:, None] & (jnp.arange(chunk, dtype=jnp.int32)[None, :] < counts[:, None])
    verified = dataclasses.replace(
        x, positions=jnp.where(kept, start[:, None] + jnp.arange(chunk)[None, :], -1).reshape(-1),
        lengths=jnp.where(live, start + counts, x.lengths), query_lens=jnp.where(live, counts, 0),
    )
    # Their features are stored too: a later request sharing these pages re-reads a page's last position.
    return _head_pass(remember(head, verified, features), params, verified, features, emitted.reshape(rows * chunk))[1]
