"""The compiled programs. Every jax.jit of the package lives here; the cache is always donated."""

from __future__ import annotations

import jax

from jaxinfer import batch_step, batch_verify, generation
from jaxinfer.speculative import loop as speculative_loop

prefill = jax.jit(
    generation.prefill, static_argnames=("cfg", "prompt_bucket"), donate_argnames=("state",)
)
decode_loop = jax.jit(generation.decode_loop, static_argnames=("cfg",), donate_argnames=("state",))
all_logits = jax.jit(generation.all_logits, static_argnames=("cfg",))
speculative_decode = jax.jit(
    speculative_loop.speculative_decode,
    static_argnames=("cfg", "proposer", "spec", "prompt_bucket"),
    donate_argnames=("state", "proposer_state"),
)
speculative_probe = jax.jit(speculative_loop.probe, static_argnames=("cfg", "proposer", "spec", "kind"))
ragged_step = jax.jit(batch_step.ragged_step, static_argnames=("cfg",), donate_argnames=("pages",))
multi_decode = jax.jit(batch_step.multi_decode, static_argnames=("cfg", "max_steps"), donate_argnames=("pages",))
verify_step = jax.jit(batch_verify.verify_step, static_argnames=("cfg", "rule"), donate_argnames=("pages",))
