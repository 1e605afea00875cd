"""vLLM's repetition, presence and frequency penalties, and OpenAI's logit bias, as pure functions of logits."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Penalties:
    """Per-row penalty settings and what each row has seen."""

    presence: jax.Array  # [R] float32
    frequency: jax.Array  # [R] float32
    repetition: jax.Array  # [R] float32; 1 = off
    output_counts: jax.Array  # [R, V] int32 occurrences of each token in the output
    in_prompt: jax.Array  # [R, V] bool tokens of the prompt


def apply_penalties(logits: jax.Array, p: Penalties) -> jax.Array:
    """Penalized logits [R, V]: repetition over prompt and output, presence/frequency over output."""
    counts = p.output_counts.astype(jnp.float32)
    seen = (p.output_counts > 0) | p.in_prompt
    rep = p.repetition[:, None]
    repeated = jnp.where(logits > 0, logits / rep, logits * rep)
    logits = jnp.where(seen, repeated, logits)
    return logits - p.frequency[:, None] * counts - p.presence[:, None] * (counts > 0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PenaltyCounts:
    """What each penalty slot's request has seen, kept on the device between steps (slot 0 unused)."""

    output_counts: jax.Array  # [S, V] int32 occurrences of each token in the slot's output
    in_prompt: jax.Array  # [S, V] bool tokens of the slot's prompt


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PenaltyRows:
    """Each row's penalty settings and its sampling slot (its counts and logit bias; 0: none, see slot_state)."""

    presence: jax.Array  # [R] float32
    frequency: jax.Array  # [R] float32
    repetition: jax.Array  # [R] float32; 1 = off
    slots: jax.Array  # [R] int32


def penalize(logits: jax.Array, rows: PenaltyRows, counts: PenaltyCounts, branchless: bool) -> jax.Array:
    """Logits [R, V] with each penalized row's penalties applied from its slot's counts.

    Unpenalized rows (slot 0, settings that change nothing) come out unchanged, so branchless
    programs apply them to every row; others skip the [R, V] work unless some row is penalized.
    """
    def apply() -> jax.Array:
        seen = Penalties(rows.presence, rows.frequency, rows.repetition, counts.output_counts[rows.slots],
                         counts.in_prompt[rows.slots])
        return apply_penalties(logits, seen)

    if branchless:
        return apply()
    return jax.lax.cond(jnp.any(rows.slots > 0), apply, lambda: logits)


def count_tokens(counts: PenaltyCounts, slots: jax.Array, tokens: jax.Array, kept: jax.Array) -> PenaltyCounts:
    """Add tokens [R] of the kept rows to their slots' output counts (slot 0 takes nothing)."""
    add = (kept & (slots > 0)).astype(jnp.int32)
    return dataclasses.replace(counts, output_counts=counts.output_counts.at[slots, tokens].add(add))


def reset_counts(counts: PenaltyCounts, slot: jax.Array, prompt: jax.Array, output: jax.Array) -> PenaltyCounts:
    """Slot `slot` holding a request's prompt ids [L] and output ids [L] (both -1 padded)."""
    vocab = counts.output_counts.shape[1]
    seen = jnp.zeros((vocab,), bool).at[jnp.where(prompt >= 0, prompt, vocab)].set(True, mode="drop")
    occurrences = jnp.zeros((vocab,), jnp.int32).at[jnp.where(output >= 0, output, vocab)].add(1, mode="drop")
    return PenaltyCounts(counts.output_counts.at[slot].set(occurrences), counts.in_prompt.at[slot].set(seen))


def add_logit_bias(logits: jax.Array, token_ids: jax.Array, bias: jax.Array) -> jax.Array:
    """Logits [R, V] plus each row's bias [R, NB] at its token_ids [R, NB] (-1: an unused slot)."""
    rows = jnp.arange(logits.shape[0])[:, None]
    columns = jnp.where(token_ids >= 0, token_ids, logits.shape[1])  # unused slots fall outside and drop
    return logits.at[rows, columns].add(bias.astype(logits.dtype), mode="drop")
