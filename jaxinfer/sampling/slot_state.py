"""Sampling state that stays on the device between engine steps, one slot per request that needs it.

Penalties need every token a request has seen and `logit_bias` up to MAX_LOGIT_BIAS entries:
shipped with each step they cost [rows, vocab] counts, or [rows, MAX_LOGIT_BIAS] ids and biases
(~150 KB a step at 64 rows, for rows that mostly have none). A request that needs either holds
a slot (runtime/sampling_slots), written once when it takes it (`reset_slot`); a step ships
each row's slot index, and rows without one read slot 0, which holds nothing.
"""

from __future__ import annotations

import dataclasses

import jax

from jaxinfer.sampling.penalties import PenaltyCounts, reset_counts


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SlotState:
    """Per-slot penalty counts and logit bias (slot 0: no counts read, no bias)."""

    counts: PenaltyCounts
    bias_ids: jax.Array  # [S, MAX_LOGIT_BIAS] int32 token ids of the slot's logit_bias, -1 padded
    bias: jax.Array  # [S, MAX_LOGIT_BIAS] float32 what is added to those tokens' logits


def reset_slot(
    state: SlotState, slot: jax.Array, prompt: jax.Array, output: jax.Array, bias_ids: jax.Array, bias: jax.Array,
) -> SlotState:
    """Slot `slot` holding a request's prompt and output ids [L] (-1 padded) and its logit bias [NB]."""
    return SlotState(
        reset_counts(state.counts, slot, prompt, output),
        state.bias_ids.at[slot].set(bias_ids), state.bias.at[slot].set(bias),
    )


def row_bias(state: SlotState, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(token ids [R, NB], biases [R, NB]) of the rows whose slots are `slots` [R]."""
    return state.bias_ids[slots], state.bias[slots]
