"""The compiled programs of the package outside `speculative/` (whose loop is in
`speculative/programs.py`); the cache is always donated."""

from __future__ import annotations

import jax

from jaxinfer import batch_step, batch_verify, generation

prefill = jax.jit(
    generation.prefill, static_argnames=("cfg", "prompt_bucket"), donate_argnames=("state",)
)
decode_loop = jax.jit(generation.decode_loop, static_argnames=("cfg",), donate_argnames=("state",))
all_logits = jax.jit(generation.all_logits, static_argnames=("cfg",))
# The engine's steps; a draft model's pool (when speculating with one) is donated with the target's.
ragged_step = jax.jit(batch_step.ragged_step, static_argnames=("cfg",), donate_argnames=("pages", "draft"))
multi_decode = jax.jit(
    batch_step.multi_decode, static_argnames=("cfg", "max_steps", "stop_early"), donate_argnames=("pages", "draft")
)
verify_rounds = jax.jit(
    batch_verify.verify_rounds, static_argnames=("cfg", "max_rounds", "rule"), donate_argnames=("pages", "draft")
)
