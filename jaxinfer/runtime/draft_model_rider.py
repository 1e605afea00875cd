"""Drafting with a draft model inside the serving engine's verify step.

The draft's pool holds K/V of the tokens the target's does (see `flat_forward`), except those of
plain decode calls: reading them would cost a draft forward per step even while speculation is
off, so a verify step first catches the draft up on the positions it has not read (`catch_up`,
CATCH_UP_CHUNK per row and forward). Then the draft decodes `[last token, d_1 .. d_k]` one token
per row at a time, drawing d_{i+1} from its processed distribution (the q of exact rejection
sampling); its last call only writes d_k's K/V, so the pool stays complete whether the target
accepts all drafts or not.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.models import Weights, lm_logits
from jaxinfer.runtime.engine_step import StepInputs
from jaxinfer.runtime.flat_forward import (
    DraftModel,
    catch_up_inputs,
    catch_up_span,
    decode_inputs,
    step_hidden,
    window_tokens,
)
from jaxinfer.runtime.host_step import CATCH_UP_CHUNK, CATCH_UP_ROUNDS
from jaxinfer.speculative.rejection import DRAFT_TAG, draw, position_keys, sampled_logprobs


def catch_up(
    draft: DraftModel, draft_weights: Weights, x: StepInputs, window: jax.Array, start: jax.Array
) -> DraftModel:
    """The draft with K/V written for positions start .. L-2 of each row (L-1: the row's last token,
    the verify chunk's first; `propose` writes it), at most CATCH_UP_SPAN of them (see
    flat_forward.catch_up_span); window [R, CATCH_UP_WINDOW] holds each row's tokens from start on."""
    begin, end = catch_up_span(x, start)
    index = jnp.arange(CATCH_UP_CHUNK, dtype=jnp.int32)

    def step(carry: tuple) -> tuple:
        begin, pages = carry
        tokens = window_tokens(window, start, begin[:, None] + index[None, :]).reshape(-1)
        inputs = dataclasses.replace(catch_up_inputs(x, begin, end, CATCH_UP_CHUNK), tokens=tokens)
        _, pages = step_hidden(draft_weights, pages, inputs, draft.cfg)
        return begin + CATCH_UP_CHUNK, pages

    carry = (begin, draft.pages)
    if x.sampling.params.branchless:  # finished rows' chunks are all padding: they write nothing
        _, pages = jax.lax.fori_loop(0, CATCH_UP_ROUNDS, lambda _, c: step(c), carry)
    else:
        _, pages = jax.lax.while_loop(lambda c: jnp.any(c[0] < end), step, carry)
    return dataclasses.replace(draft, pages=pages)


def propose(
    draft: DraftModel, draft_weights: Weights, x: StepInputs, count: jax.Array
) -> tuple[jax.Array, jax.Array, DraftModel]:
    """Drafts [R, C-1], their processed distributions [R, C-1, V_target] and the updated draft.

    x is the verify layout (every row one chunk of C tokens starting with its last token);
    row r drafts count[r] tokens. Positions past a row's count hold token 0 and no mass.
    """
    rows = x.lengths.shape[0]
    chunk = x.tokens.shape[0] // rows
    start = x.lengths - x.query_lens  # position of each row's last token
    params = x.sampling.params
    tokens = jnp.zeros((rows, chunk - 1), jnp.int32)
    logprobs = jnp.full((rows, chunk - 1, draft.target_vocab), -jnp.inf, jnp.float32)
    live_rows = x.query_lens > 0

    def step(carry: tuple) -> tuple:
        i, pages, token, tokens, logprobs = carry
        inputs = decode_inputs(x, token, start + i, live_rows & (i <= count))
        hidden, pages = step_hidden(draft_weights, pages, inputs, draft.cfg)
        logits = lm_logits(draft_weights, hidden).astype(jnp.float32)
        pad = draft.target_vocab - draft.cfg.vocab_size
        if pad:  # the draft's vocabulary is a prefix of the target's: extra ids are impossible
            logits = jnp.pad(logits, ((0, 0), (0, pad)), constant_values=-jnp.inf)
        q = sampled_logprobs(logits, params)
        keys = position_keys(params, (start + i + 1)[:, None], DRAFT_TAG)[:, 0]
        token = draw(q, params, keys)
        slot = jnp.minimum(i, chunk - 2)
        wanted = (i < count)[:, None]
        tokens = tokens.at[:, slot].set(jnp.where(wanted[:, 0], token, tokens[:, slot]))
        logprobs = logprobs.at[:, slot].set(jnp.where(wanted, q, logprobs[:, slot]))
        return i + 1, pages, token, tokens, logprobs

    # count + 1 calls: the last writes K/V of the final draft (a round may accept all of them).
    calls = jnp.max(jnp.where(live_rows, count, -1)) + 1
    carry = (jnp.int32(0), draft.pages, x.tokens[::chunk], tokens, logprobs)
    if x.sampling.params.branchless:  # every call a row does not need is padding (position -1)
        carry = jax.lax.fori_loop(0, chunk, lambda _, c: step(c), carry)
    else:
        carry = jax.lax.while_loop(lambda c: c[0] < calls, step, carry)
    _, pages, _, tokens, logprobs = carry
    return tokens, logprobs, dataclasses.replace(draft, pages=pages)
