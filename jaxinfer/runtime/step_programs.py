"""The compiled programs of the package: the engine's steps (their pools and row state donated),
the sampling-slot reset, the all-positions pass of prompt logprobs and the pooled pass of embeddings (a
decoder's, or an encoder's: models/encoder_heads)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax

from jaxinfer.models import all_positions, encoder_heads, vision_language, whisper_encoder
from jaxinfer.runtime import engine_step, row_state, verify_carry, verify_step
from jaxinfer.runtime.packed_tree import pack_device, unpack_device
from jaxinfer.sampling import slot_state

_STATIC_ARGNAMES: dict[Callable, tuple[str, ...]] = {}


def program(function: Callable, static: tuple[str, ...] = (), donate: tuple[str, ...] = ()) -> Callable:
    """jax.jit of function, its static argument names kept for `static_argnames`."""
    jitted = jax.jit(function, static_argnames=static, donate_argnames=donate)
    _STATIC_ARGNAMES[jitted] = static
    return jitted


def static_argnames(jitted: Callable) -> tuple[str, ...]:
    """The static argument names of a program made by `program` (runtime/executables keys calls on them)."""
    return _STATIC_ARGNAMES[jitted]


all_logits = program(all_positions.all_logits, static=("cfg",))
pooled_hidden = program(all_positions.pooled_hidden, static=("cfg", "pooling"))
encoder_pooled = program(encoder_heads.encoder_pooled, static=("pooling",))  # an encoder's (its config in its weights)
# a vision-language model's tower and projector
image_features = program(vision_language.image_features, static=("cfg",))
# an encoder-decoder model's encoder, writing one row slot's cross-attention keys and values into the pools
encode_audio = program(whisper_encoder.encode_into_slot, donate=("pages",))


def packed_io(program: Callable) -> Callable:
    """An engine step program called as (weights, pages, state, inputs, bitmask, **static and pools):
    `inputs` is one `PackedTree` of (its StepInputs, the arguments it takes after the bitmask: see
    device_inputs.step_extras), and its outputs come back as one, so a step makes one transfer each
    way, not one per small array. Its row state comes back replicated, as it went in (see
    row_state.replicated)."""

    @functools.wraps(program)
    def run(*args, **kwargs):
        weights, pages, state, inputs, bitmask = args
        x, extras = unpack_device(inputs)
        outputs, pages, state, draft = program(weights, pages, state, x, bitmask, *extras, **kwargs)
        return pack_device(outputs), pages, row_state.replicated(state, pages.layout), draft

    return run


def _verify(
    weights, pages, state, x, bitmask, drafts, num_rounds, capacity, window, draft_start, cfg, max_rounds,
    rule=verify_step.EXACT_RULE, draft=None, draft_weights=None,
):
    """verify_rounds with the row state read (page tables, logit bias, the decode carry of rows started
    before the call ahead landed) and passed on with each row's new carry (penalized rows never
    verify, so no counts change), so every engine step program takes and returns the same state."""
    x, state = engine_step.with_device_inputs(x, state, bitmask)
    x, drafts, draft_start = verify_carry.carried_verify_rows(state, x, drafts, draft_start)
    out, pages, draft = verify_step.verify_rounds(weights, pages, x, drafts, num_rounds, capacity, window,
                                                  draft_start, cfg, max_rounds, rule, draft, draft_weights)
    return out, pages, verify_carry.with_verify_carry(state, x, out), draft


# The engine's steps; a draft model's pool (when speculating with one) is donated with the target's.
DONATED = ("pages", "state", "draft")
ragged_step = program(packed_io(engine_step.ragged_step), static=("cfg", "draft_reads"), donate=DONATED)
multi_decode = program(packed_io(engine_step.multi_decode), static=("cfg", "max_steps", "stop_early"), donate=DONATED)
verify_rounds = program(packed_io(_verify), static=("cfg", "max_rounds", "rule"), donate=DONATED)
reset_sampling_slot = program(slot_state.reset_slot, donate=("state",))
