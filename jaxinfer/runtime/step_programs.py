"""The compiled programs of the package outside `speculative/` (whose loop is in
`speculative/programs.py`); the cache is always donated."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax

from jaxinfer.models import contiguous_decode
from jaxinfer.runtime import engine_step, verify_step
from jaxinfer.runtime.packed_tree import pack_device, unpack_device
from jaxinfer.sampling import slot_state

prefill = jax.jit(
    contiguous_decode.prefill, static_argnames=("cfg", "prompt_bucket"), donate_argnames=("state",)
)
decode_loop = jax.jit(contiguous_decode.decode_loop, static_argnames=("cfg",), donate_argnames=("state",))
all_logits = jax.jit(contiguous_decode.all_logits, static_argnames=("cfg",))


def packed_io(program: Callable) -> Callable:
    """program taking any argument as a `PackedTree` and returning its outputs (the first result) as one:
    an engine step then makes one transfer each way, not one per small array."""

    @functools.wraps(program)
    def run(*args, **kwargs):
        args = [unpack_device(a) for a in args]
        outputs, *rest = program(*args, **{k: unpack_device(v) for k, v in kwargs.items()})
        return (pack_device(outputs), *rest)

    return run


def _verify(
    weights, pages, state, x, bitmask, drafts, num_rounds, capacity, window, draft_start, cfg, max_rounds,
    rule=verify_step.EXACT_RULE, draft=None, draft_weights=None,
):
    """verify_rounds with the row state read (page tables, logit bias) and passed on (penalized rows
    never verify, so no counts change), so every engine step program takes and returns the same state."""
    x, state = engine_step.with_device_inputs(x, state, bitmask)
    out, pages, draft = verify_step.verify_rounds(weights, pages, x, drafts, num_rounds, capacity, window,
                                                  draft_start, cfg, max_rounds, rule, draft, draft_weights)
    return out, pages, state, draft


# The engine's steps; a draft model's pool (when speculating with one) is donated with the target's.
DONATED = ("pages", "state", "draft")
ragged_step = jax.jit(packed_io(engine_step.ragged_step), static_argnames=("cfg",), donate_argnames=DONATED)
multi_decode = jax.jit(
    packed_io(engine_step.multi_decode), static_argnames=("cfg", "max_steps", "stop_early"), donate_argnames=DONATED,
)
verify_rounds = jax.jit(
    packed_io(_verify), static_argnames=("cfg", "max_rounds", "rule"), donate_argnames=DONATED,
)
reset_sampling_slot = jax.jit(slot_state.reset_slot, donate_argnames=("state",))
