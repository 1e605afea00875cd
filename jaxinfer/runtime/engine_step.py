"""The serving engine's device programs: one ragged step, and up to N decode steps in a loop.

A step is T tokens packed end to end (each row's tokens contiguous, then padding at position
-1) over R rows; attention reads each token's row's pages up to its own position (see
cache/ragged_view), so the layout needs no shape but (T, R). Both programs are pure functions of
(weights, page pools, row slot state, inputs) built by the runner on the host. Sampling happens
inside: logit bias and penalties (from per-slot state that stays on the device), min_tokens (stop
ids masked until reached), the structured-output bitmask (all ones for free rows), then the same
`sampling.sample` as the generation loop, keyed by (seed, position) so a request's tokens do
not depend on what else is in the batch. The top MAX_LOGPROBS logprobs of the model's raw
distribution come back for every row (computed when any row asks, or always in a branchless
program). No option is a static variant: every request mix runs the programs warm-up compiled.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, lm_logits
from jaxinfer.models.embed_override import EmbedOverride
from jaxinfer.runtime import assistant_rider
from jaxinfer.runtime.assistant_rider import AssistantDraft
from jaxinfer.runtime.eagle_rider import EagleDraft, head_reads, remember
from jaxinfer.runtime.flat_forward import DraftModel, read_tokens, step_features
from jaxinfer.runtime.ngram_rider import NgramDraft, store
from jaxinfer.runtime.row_state import RowState, carried_rows, row_tables, with_carry, with_page_entries
from jaxinfer.sampling.penalties import PenaltyCounts, PenaltyRows, add_logit_bias, count_tokens, penalize
from jaxinfer.sampling.row_order import top_k_in_parts
from jaxinfer.sampling.sampler import SamplingArrays, sample, skip_unless
from jaxinfer.sampling.slot_state import row_bias
from jaxinfer.sampling.token_bitmask import apply_token_bitmask

# What drafts beside the target: a draft model, an EAGLE head, a Gemma 4 assistant, the device's prompt lookup
Rider = DraftModel | EagleDraft | AssistantDraft | NgramDraft | None

MAX_LOGPROBS = 20


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RowSampling:
    """How each row picks its next token."""

    params: SamplingArrays  # its static `branchless` is the program's
    stop_ids: jax.Array  # [R, MAX_STOP_IDS] int32, -1 padded
    min_lengths: jax.Array  # [R] int32 stop ids are masked while the new token's index is below this
    max_lengths: jax.Array  # [R] int32 a row is done once it holds this many tokens
    # Filled on the device (`with_device_inputs`; None as the host ships them):
    bias_ids: jax.Array | None  # [R, MAX_LOGIT_BIAS] int32 token ids of each row's logit_bias, -1 padded
    bias: jax.Array | None  # [R, MAX_LOGIT_BIAS] float32 what is added to those tokens' logits
    penalties: PenaltyRows
    samples: jax.Array  # [R] bool the row's token is kept (counted for penalties)
    want_logprobs: jax.Array  # [R] bool
    # [P, ceil(V / 32)] int32 packed allowed tokens per sampled position (structured output; all ones
    # where free): P = R in plain and decode steps (every decode iteration; constrained rows run one),
    # R * C in verify steps (row r's position j at r * C + j). A program argument of its own (a
    # device-resident all-ones array when no row is constrained), set here on the device.
    bitmask: jax.Array | None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class StepInputs:
    """One step's packed tokens and rows."""

    tokens: jax.Array  # [T] int32
    positions: jax.Array  # [T] int32, -1 for padding
    token_rows: jax.Array  # [T] int32
    row_slots: jax.Array  # [R] int32 each row's slot (runtime/row_state; 0: padding)
    adapters: jax.Array  # [R] int32 each row's LoRA adapter slot (-1: the base model; models/lora_weight)
    page_entries: jax.Array  # [D, 3] int32 (slot, column, page) the slots' page tables gained (page_table_diffs)
    page_counts: jax.Array  # [R] int32 pages each row holds: its table's columns past them read page 0
    page_table: jax.Array | None  # [R, W] int32, read from the slots' tables on the device (None as shipped)
    lengths: jax.Array  # [R] int32 tokens per row after this step (index of the next token)
    query_lens: jax.Array  # [R] int32
    last_index: jax.Array  # [R] int32 flat index of each row's last token
    # [T] int32 the token after each flat token where the host knows it (prompt), else -1 (the
    # one the step samples); an EAGLE head reads it
    next_tokens: jax.Array
    sampling: RowSampling
    # [R] bool the row's token and length are the decode carry of its slot (row_state), not these
    # inputs: the multi-step decode call before it was still running when this one was planned
    carried: jax.Array
    # [T, 3] int32 M-RoPE models only (Qwen2-VL): each token's (temporal, height, width) rotary position minus
    # its position (image tokens' grid offsets, the images' delta after them); None for every other model
    rope_offsets: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class StepOutputs:
    """New tokens per row and step, with the model's top logprobs (plain steps)."""

    tokens: jax.Array  # [R, S] int32
    counts: jax.Array  # [R] int32 valid tokens per row
    logprobs: jax.Array | None  # [R, S] float32 of the chosen token
    top_ids: jax.Array | None  # [R, S, MAX_LOGPROBS] int32
    top_logprobs: jax.Array | None  # [R, S, MAX_LOGPROBS] float32
    drafted: jax.Array | None = None  # [R, rounds] int32 drafts per verify round (-1: the round did not run)
    accepted: jax.Array | None = None  # [R, rounds] int32 of them accepted
    ranks: jax.Array | None = None  # [R, S] int32 the chosen token's rank (1 = most likely)


def with_device_inputs(x: StepInputs, state: RowState, bitmask: jax.Array) -> tuple[StepInputs, RowState]:
    """x with what the host does not ship, and the state with the step's page entries written: each
    row's page table and logit bias from its slot, and the step's structured-output bitmask."""
    state = with_page_entries(state, x.page_entries)
    ids, bias = row_bias(state.sampling, x.sampling.penalties.slots)
    sampling = dataclasses.replace(x.sampling, bias_ids=ids, bias=bias, bitmask=bitmask)
    return dataclasses.replace(x, page_table=row_tables(state, x.row_slots, x.page_counts), sampling=sampling), state


def pick_tokens(logits: jax.Array, s: RowSampling, lengths: jax.Array, counts: PenaltyCounts) -> jax.Array:
    """Next tokens [R] for raw logits [R, V] of rows whose next token goes to index lengths [R]."""
    logits = add_logit_bias(logits, s.bias_ids, s.bias)
    logits = penalize(logits, s.penalties, counts, s.params.branchless)
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
    k = min(MAX_LOGPROBS, logp.shape[-1])  # a vocabulary smaller than K (tiny test models): pad the rest
    top_values, top_ids = top_k_in_parts(logp, k)
    top_values = jnp.pad(top_values, ((0, 0), (0, MAX_LOGPROBS - k)), constant_values=-jnp.inf)
    top_ids = jnp.pad(top_ids, ((0, 0), (0, MAX_LOGPROBS - k)))
    chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    ranks = 1 + jnp.sum(logp > chosen[:, None], axis=-1, dtype=jnp.int32)
    return chosen, top_ids.astype(jnp.int32), top_values, ranks


def row_logprobs(logits: jax.Array, tokens: jax.Array, s: RowSampling) -> tuple[jax.Array, ...]:
    """top_logprobs for every row: computed when some row wants them (always when branchless), else zeros.

    A log-softmax and top-k over [R, V] every step would cost a CPU more than the rest of a small
    model's step (64 x 49152 logits: ~70 ms on 2 busy cores); a conditional skips it there.
    """
    rows = tokens.shape[0]

    def skipped() -> tuple[jax.Array, ...]:
        zeros = jnp.zeros((rows, MAX_LOGPROBS))
        return jnp.zeros((rows,)), zeros.astype(jnp.int32), zeros, jnp.ones((rows,), jnp.int32)

    return skip_unless(jnp.any(s.want_logprobs), lambda: top_logprobs(logits, tokens), skipped, s.params.branchless)


def feature_taps(draft: Rider) -> tuple[int, ...] | None:
    """What the target's forward must hand the draft: an EAGLE head's features, a Gemma 4 assistant's final
    post-norm hidden state (no taps), else nothing."""
    if isinstance(draft, AssistantDraft):
        return ()
    return draft.ecfg.feature_layers if isinstance(draft, EagleDraft) else None


def _row_logits(weights: Weights, pages: PagedKVCache, x: StepInputs, cfg: ModelConfig, draft: Rider,
                override: EmbedOverride | None = None):
    hidden, features, pages = step_features(weights, pages, x, cfg, feature_taps(draft), override)
    return lm_logits(weights, hidden[x.last_index]), features, pages


def ride(
    draft: Rider, draft_weights, x: StepInputs, features: jax.Array | None, sampled: jax.Array, reads: bool = True
) -> Rider:
    """The draft after a plain program: a draft model reads the step's tokens, an EAGLE head
    their features and next tokens (the sampled [R] where the host did not know them). Without
    reads a draft model is left as it was and a head only stores the features (for its catch-up).
    The device's prompt lookup always stores the tokens and a Gemma 4 assistant the target's final states
    (neither has a catch-up, and a store is cheap)."""
    if isinstance(draft, NgramDraft):
        return store(draft, x)
    if isinstance(draft, AssistantDraft):  # it reads the target's pages: its states are all it keeps
        return assistant_rider.remember(draft, x, features)
    if isinstance(draft, EagleDraft):
        return head_reads(draft, draft_weights, x, features, sampled) if reads else remember(draft, x, features)
    return read_tokens(draft, draft_weights, x) if reads else draft


def _outputs(logits: jax.Array, tokens: jax.Array, s: RowSampling) -> StepOutputs:
    chosen, ids, values, ranks = row_logprobs(logits, tokens, s)
    counts = jnp.ones(tokens.shape, jnp.int32)
    return StepOutputs(tokens[:, None], counts, chosen[:, None], ids[:, None], values[:, None], ranks=ranks[:, None])


def ragged_step(
    weights: Weights, pages: PagedKVCache, state: RowState, x: StepInputs, bitmask: jax.Array, cfg: ModelConfig,
    draft: Rider = None, draft_weights=None, draft_reads: bool = True, images: EmbedOverride | None = None,
) -> tuple[StepOutputs, PagedKVCache, RowState, Rider]:
    """Run decode tokens and prefill chunks together; sample one token per row (the draft reads them
    too, unless draft_reads is False: while speculation does not pay, see `ride`). images: a
    vision-language model's image rows for the step's placeholder tokens (only its programs take them)."""
    x, state = with_device_inputs(x, state, bitmask)
    logits, features, pages = _row_logits(weights, pages, x, cfg, draft, images)
    tokens = pick_tokens(logits, x.sampling, x.lengths, state.sampling.counts)
    state = _counted(state, x.sampling, tokens, x.sampling.samples)
    draft = ride(draft, draft_weights, x, features, tokens, draft_reads)
    return _outputs(logits, tokens, x.sampling), pages, state, draft


def _counted(state: RowState, s: RowSampling, tokens: jax.Array, kept: jax.Array) -> RowState:
    counts = count_tokens(state.sampling.counts, s.penalties.slots, tokens, kept)
    return dataclasses.replace(state, sampling=dataclasses.replace(state.sampling, counts=counts))


def carried_decode_inputs(x: StepInputs, state: RowState, bitmask: jax.Array) -> tuple[StepInputs, RowState]:
    """`with_device_inputs`, then each carried row's token, position and length from its slot's
    decode carry (a row the call ahead finished becomes padding)."""
    x, state = with_device_inputs(x, state, bitmask)
    tokens, positions, lengths, query_lens = carried_rows(
        state, x.row_slots, x.carried, x.tokens, x.positions, x.lengths, x.query_lens)
    return dataclasses.replace(x, tokens=tokens, positions=positions, lengths=lengths, query_lens=query_lens), state


def no_decode_outputs(rows: int, max_steps: int) -> StepOutputs:
    """Zeroed outputs of `rows` rows over max_steps decode steps (each step records into them)."""
    return StepOutputs(
        tokens=jnp.zeros((rows, max_steps), jnp.int32),
        counts=jnp.zeros((rows,), jnp.int32),
        logprobs=jnp.zeros((rows, max_steps), jnp.float32),
        top_ids=jnp.zeros((rows, max_steps, MAX_LOGPROBS), jnp.int32),
        top_logprobs=jnp.zeros((rows, max_steps, MAX_LOGPROBS), jnp.float32),
        ranks=jnp.zeros((rows, max_steps), jnp.int32),
    )


def multi_decode(
    weights: Weights, pages: PagedKVCache, state: RowState, x: StepInputs, bitmask: jax.Array,
    num_steps: jax.Array, cfg: ModelConfig, max_steps: int, draft: Rider = None, draft_weights=None,
    stop_early: bool = True,
) -> tuple[StepOutputs, PagedKVCache, RowState, Rider]:
    """Up to num_steps (<= max_steps) decode steps of an all-decode batch (one token per row, T == R).

    stop_early: the loop ends when any row finishes (its slot frees for a waiting request);
    otherwise it runs max_steps iterations, finished rows idle and write nothing. XLA:GPU reads
    a loop's continue-predicate on the host after each iteration, a round trip that leaves the
    GPU idle; a loop of known trip count is queued without them.
    Rows with query_len 0 are padding and start done. Pages for every step were reserved.
    Carried rows take their token and length from their slots' decode carry (a finished one is
    padding); the call leaves every row's carry there, for a call planned before this one lands.
    A draft model or EAGLE head does not read them (an EAGLE head's features are stored): the
    next verify step catches it up (`draft_model_rider.catch_up`, `eagle_rider.catch_up`).
    """
    x, state = carried_decode_inputs(x, state, bitmask)
    empty = no_decode_outputs(x.lengths.shape[0], max_steps)
    start_done = x.query_lens == 0

    def cond(carry):
        step, _, _, _, _, done, _ = carry
        return (step < num_steps) & ~jnp.any(done & ~start_done)

    def body(carry):
        step, x, pages, state, draft, done, out = carry
        logits, features, pages = _row_logits(weights, pages, x, cfg, draft)
        s = x.sampling
        tokens = pick_tokens(logits, s, x.lengths, state.sampling.counts)
        if isinstance(draft, EagleDraft):  # the head catches up in the next verify step
            draft = remember(draft, x, features)
        elif isinstance(draft, AssistantDraft):  # a later verify step drafts from the state at its P - 1
            draft = assistant_rider.remember(draft, x, features)
        elif isinstance(draft, NgramDraft):  # the lookup reads every position's token
            draft = store(draft, x)
        active = ~done & (step < num_steps)
        state = _counted(state, s, tokens, active)
        hit_stop = jnp.any(tokens[:, None] == s.stop_ids, axis=-1) & (x.lengths >= s.min_lengths)
        new_lengths = x.lengths + active.astype(jnp.int32)
        done = done | (active & (hit_stop | (new_lengths >= s.max_lengths)))
        out = _record(out, step, tokens, active, row_logprobs(logits, tokens, s))
        x = dataclasses.replace(
            x, tokens=jnp.where(active, tokens, x.tokens), positions=jnp.where(active, x.lengths, -1),
            lengths=new_lengths,
        )
        return step + 1, x, pages, state, draft, done, out

    carry = (jnp.int32(0), x, pages, state, draft, start_done, empty)
    if stop_early:
        carry = jax.lax.while_loop(cond, body, carry)
    else:
        carry = jax.lax.fori_loop(0, max_steps, lambda _, c: body(c), carry)
    _, x, pages, state, draft, done, out = carry
    return out, pages, with_carry(state, x.row_slots, x.tokens, x.lengths, done), draft


def _record(out: StepOutputs, step: jax.Array, tokens: jax.Array, active: jax.Array, logprobs: tuple) -> StepOutputs:
    """Write this step's tokens and logprobs into column `step`."""
    chosen, ids, values, ranks = logprobs
    return dataclasses.replace(
        out, tokens=out.tokens.at[:, step].set(tokens), counts=out.counts + active.astype(jnp.int32),
        logprobs=out.logprobs.at[:, step].set(chosen), top_ids=out.top_ids.at[:, step].set(ids),
        top_logprobs=out.top_logprobs.at[:, step].set(values), ranks=out.ranks.at[:, step].set(ranks),
    )
