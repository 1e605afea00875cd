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


def count_tokens(p: Penalties, tokens: jax.Array, active: jax.Array) -> Penalties:
    """Add tokens [R] of the active rows to the output counts."""
    rows = jnp.arange(tokens.shape[0])
    counts = p.output_counts.at[rows, tokens].add(active.astype(jnp.int32))
    return dataclasses.replace(p, output_counts=counts)


def add_logit_bias(logits: jax.Array, token_ids: jax.Array, bias: jax.Array) -> jax.Array:
    """Logits [R, V] plus each row's bias [R, NB] at its token_ids [R, NB] (-1: an unused slot)."""
    rows = jnp.arange(logits.shape[0])[:, None]
    columns = jnp.where(token_ids >= 0, token_ids, logits.shape[1])  # unused slots fall outside and drop
    return logits.at[rows, columns].add(bias.astype(logits.dtype), mode="drop")
