"""The serving engine's device programs: one ragged step, and up to N decode steps in a loop.

Both are pure functions of (weights, page pools, inputs) built by the engine on the host.
Sampling happens inside: logit bias, penalties, min_tokens (stop ids masked until reached), the
structured-output bitmask (all ones for free rows), then the same
`sampling.sample` as the generation loop, keyed by (seed, position) so a request's tokens do
not depend on what else is in the batch. Logprobs are the model's raw distribution.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, lm_logits
from jaxinfer.runtime.eagle_rider import EagleDraft, head_reads, remember
from jaxinfer.runtime.flat_forward import DraftModel, read_tokens, step_features
from jaxinfer.sampling.penalties import Penalties, add_logit_bias, apply_penalties, count_tokens
from jaxinfer.sampling.sampler import SamplingArrays, sample
from jaxinfer.sampling.token_bitmask import apply_token_bitmask

Rider = DraftModel | EagleDraft | None  # what drafts beside the target: a draft model, an EAGLE head

MAX_LOGPROBS = 20


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RowSampling:
    """How each row picks its next token."""

    params: SamplingArrays
    stop_ids: jax.Array  # [R, NS] int32, -1 padded
    min_lengths: jax.Array  # [R] int32 stop ids are masked while the new token's index is below this
    max_lengths: jax.Array  # [R] int32 a row is done once it holds this many tokens
    bias_ids: jax.Array  # [R, MAX_LOGIT_BIAS] int32 token ids of each row's logit_bias, -1 padded
    bias: jax.Array  # [R, MAX_LOGIT_BIAS] float32 what is added to those tokens' logits
    penalties: Penalties | None
    # [P, ceil(V / 32)] int32 packed allowed tokens per sampled position (structured output; all ones
    # where free): P = R in plain steps, R * C in verify steps (row r's position j at r * C + j)
    bitmask: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class StepInputs:
    """One step's flat tokens and rows (see ragged_cache for the layout)."""

    tokens: jax.Array  # [N] int32
    positions: jax.Array  # [N] int32, -1 for padding
    token_rows: jax.Array  # [N] int32
    page_table: jax.Array  # [R, P] int32
    lengths: jax.Array  # [R] int32 tokens per row after this step (index of the next token)
    query_lens: jax.Array  # [R] int32
    last_index: jax.Array  # [R] int32 flat index of each row's last token
    # [N] int32 the token after each flat token where the host knows it (prompt), else -1 (the
    # one the step samples); an EAGLE head reads it
    next_tokens: jax.Array
    sampling: RowSampling
    num_decode: int = dataclasses.field(default=0, metadata=dict(static=True))
    want_logprobs: bool = dataclasses.field(default=False, metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class StepOutputs:
    """New tokens per row and step, with the model's top logprobs when asked for."""

    tokens: jax.Array  # [R, S] int32
    counts: jax.Array  # [R] int32 valid tokens per row
    logprobs: jax.Array | None  # [R, S] float32 of the chosen token
    top_ids: jax.Array | None  # [R, S, MAX_LOGPROBS] int32
    top_logprobs: jax.Array | None  # [R, S, MAX_LOGPROBS] float32
    drafted: jax.Array | None = None  # [R, rounds] int32 drafts per verify round (-1: the round did not run)
    accepted: jax.Array | None = None  # [R, rounds] int32 of them accepted
    ranks: jax.Array | None = None  # [R, S] int32 the chosen token's rank (1 = most likely), with logprobs


def pick_tokens(logits: jax.Array, s: RowSampling, lengths: jax.Array) -> jax.Array:
    """Next tokens [R] for raw logits [R, V] of rows whose next token goes to index lengths [R]."""
    logits = add_logit_bias(logits, s.bias_ids, s.bias)
    if s.penalties is not None:
        logits = apply_penalties(logits, s.penalties)
    logits = mask_early_stops(logits, s.stop_ids, s.min_lengths, lengths)
    logits = apply_token_bitmask(logits, s.bitmask)
    return sample(logits, s.params, lengths)


def mask_early_stops(
    logits: jax.Array, stop_ids: jax.Array, min_lengths: jax.Array, lengths: jax.Array
) -> jax.Array:
    """Logits [R, V] with each row's stop ids [R, NS] at -inf while its next index is below min_lengths."""
    too_early = (lengths < min_lengths)[:, None]
    rows = jnp.arange(logits.shape[0])[:, None]
    stop_cols = jnp.where(too_early & (stop_ids >= 0), stop_ids, logits.shape[1])
    return logits.at[rows, stop_cols].set(-jnp.inf, mode="drop")


def top_logprobs(logits: jax.Array, tokens: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(logprob of tokens [R], top ids [R, K], top logprobs [R, K], rank of tokens [R]) of the raw distribution.

    The rank (1 + tokens more likely, vLLM's) is counted here: the host only sees the top K.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    top_values, top_ids = jax.lax.top_k(logp, MAX_LOGPROBS)
    chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    ranks = 1 + jnp.sum(logp > chosen[:, None], axis=-1, dtype=jnp.int32)
    return chosen, top_ids.astype(jnp.int32), top_values, ranks


def feature_taps(draft: Rider) -> tuple[int, ...] | None:
    """What the target's forward must hand the draft: an EAGLE head's features, else nothing."""
    return draft.ecfg.feature_layers if isinstance(draft, EagleDraft) else None


def _row_logits(weights: Weights, pages: PagedKVCache, x: StepInputs, cfg: ModelConfig, draft: Rider):
    hidden, features, pages = step_features(weights, pages, x, cfg, feature_taps(draft))
    return lm_logits(weights, hidden[x.last_index]), features, pages


def ride(draft: Rider, draft_weights, x: StepInputs, features: jax.Array | None, sampled: jax.Array) -> Rider:
    """The draft after a plain program: a draft model reads the step's tokens, an EAGLE head
    their features and next tokens (the sampled [R] where the host did not know them)."""
    if isinstance(draft, EagleDraft):
        return head_reads(draft, draft_weights, x, features, sampled)
    return read_tokens(draft, draft_weights, x)


def _outputs(logits: jax.Array, tokens: jax.Array, want_logprobs: bool) -> StepOutputs:
    counts = jnp.ones(tokens.shape, jnp.int32)
    if not want_logprobs:
        return StepOutputs(tokens[:, None], counts, None, None, None)
    chosen, ids, values, ranks = top_logprobs(logits, tokens)
    return StepOutputs(tokens[:, None], counts, chosen[:, None], ids[:, None], values[:, None], ranks=ranks[:, None])


def ragged_step(
    weights: Weights, pages: PagedKVCache, x: StepInputs, cfg: ModelConfig,
    draft: Rider = None, draft_weights=None,
) -> tuple[StepOutputs, PagedKVCache, Rider]:
    """Run decode tokens and prefill chunks together; sample one token per row (the draft reads them too)."""
    logits, features, pages = _row_logits(weights, pages, x, cfg, draft)
    tokens = pick_tokens(logits, x.sampling, x.lengths)
    return _outputs(logits, tokens, x.want_logprobs), pages, ride(draft, draft_weights, x, features, tokens)


def multi_decode(
    weights: Weights, pages: PagedKVCache, x: StepInputs, num_steps: jax.Array, cfg: ModelConfig, max_steps: int,
    draft: Rider = None, draft_weights=None, stop_early: bool = True,
) -> tuple[StepOutputs, PagedKVCache, Rider]:
    """Up to num_steps (<= max_steps) decode steps of an all-decode batch.

    stop_early: the loop ends when any row finishes (its slot frees for a waiting request);
    otherwise it runs max_steps iterations, finished rows idle and write nothing. XLA:GPU reads
    a loop's continue-predicate on the host after each iteration, a round trip that leaves the
    GPU idle; a loop of known trip count is queued without them.
    Rows with query_len 0 are padding and start done. Pages for every step were reserved.
    A draft model or EAGLE head does not read them (an EAGLE head's features are stored): the
    next verify step catches it up (`batch_draft.catch_up`, `batch_eagle.catch_up`).
    """
    rows = x.lengths.shape[0]
    empty = StepOutputs(
        tokens=jnp.zeros((rows, max_steps), jnp.int32),
        counts=jnp.zeros((rows,), jnp.int32),
        logprobs=jnp.zeros((rows, max_steps), jnp.float32) if x.want_logprobs else None,
        top_ids=jnp.zeros((rows, max_steps, MAX_LOGPROBS), jnp.int32) if x.want_logprobs else None,
        top_logprobs=jnp.zeros((rows, max_steps, MAX_LOGPROBS), jnp.float32) if x.want_logprobs else None,
        ranks=jnp.zeros((rows, max_steps), jnp.int32) if x.want_logprobs else None,
    )
    start_done = x.query_lens == 0

    def cond(carry):
        step, _, _, _, done, _ = carry
        return (step < num_steps) & ~jnp.any(done & ~start_done)

    def body(carry):
        step, x, pages, draft, done, out = carry
        logits, features, pages = _row_logits(weights, pages, x, cfg, draft)
        tokens = pick_tokens(logits, x.sampling, x.lengths)
        if isinstance(draft, EagleDraft):  # the head catches up in the next verify step
            draft = remember(draft, x, features)
        active = ~done & (step < num_steps)
        hit_stop = jnp.any(tokens[:, None] == x.sampling.stop_ids, axis=-1) & (x.lengths >= x.sampling.min_lengths)
        new_lengths = x.lengths + active.astype(jnp.int32)
        done = done | (active & (hit_stop | (new_lengths >= x.sampling.max_lengths)))
        out = _record(out, step, tokens, active, logits if x.want_logprobs else None)
        sampling = x.sampling
        if sampling.penalties is not None:
            sampling = dataclasses.replace(sampling, penalties=count_tokens(sampling.penalties, tokens, active))
        x = dataclasses.replace(
            x, tokens=jnp.where(active, tokens, x.tokens), positions=jnp.where(active, x.lengths, -1),
            lengths=new_lengths, sampling=sampling,
        )
        return step + 1, x, pages, draft, done, out

    carry = (jnp.int32(0), x, pages, draft, start_done, empty)
    if stop_early:
        _, _, pages, draft, _, out = jax.lax.while_loop(cond, body, carry)
    else:
        _, _, pages, draft, _, out = jax.lax.fori_loop(0, max_steps, lambda _, c: body(c), carry)
    return out, pages, draft


def _record(out: StepOutputs, step: jax.Array, tokens: jax.Array, active: jax.Array, logits) -> StepOutputs:
    """Write this step's tokens (and logprobs) into column `step`."""
    counts = out.counts + active.astype(jnp.int32)
    new = dict(tokens=out.tokens.at[:, step].set(tokens), counts=counts)
    if logits is not None:
        chosen, ids, values, ranks = top_logprobs(logits, tokens)
        new.update(
            logprobs=out.logprobs.at[:, step].set(chosen),
            top_ids=out.top_ids.at[:, step].set(ids),
            top_logprobs=out.top_logprobs.at[:, step].set(values),
            ranks=out.ranks.at[:, step].set(ranks),
        )
    return dataclasses.replace(out, **new)
