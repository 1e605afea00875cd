"""The speculative package's compiled programs (as `steps` holds the rest); caches are donated.

They live inside the package so that `decoder` needs nothing above it: `steps` does not import
the speculative loop.
"""

from __future__ import annotations

import jax

from jaxinfer.speculative import features, loop

prefill_proposer = jax.jit(
    loop.prefill_proposer, static_argnames=("proposer", "prompt_bucket"), donate_argnames=("proposer_state",)
)
# One program per batch bucket and configuration: the prompt length is not a static argument.
speculative_decode = jax.jit(
    loop.speculative_decode,
    static_argnames=("cfg", "proposer", "spec"),
    donate_argnames=("state", "proposer_state"),
)
speculative_probe = jax.jit(
    loop.probe, static_argnames=("cfg", "proposer", "spec", "kind"), donate_argnames=("state", "proposer_state")
)
# The target's prefill that also returns the prompts' features, for a proposer that reads them (EAGLE).
prefill_features = jax.jit(
    features.prefill_features, static_argnames=("cfg", "prompt_bucket", "feature_layers"), donate_argnames=("state",)
)
