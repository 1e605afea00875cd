"""Phi-3.5-MoE's sparsemixer routing at inference: two experts, each weighted by its own masked softmax.

The first expert is the best logit; its weight is its softmax over the logits within `2 * jitter_eps`
(relative) of it, the rest masked. The second is the best once the first is masked out, weighted the same
way over the logits within reach of it (the first stays masked). The two weights are not renormalised.
Training's Gumbel sampling and Heun gradient estimate are transformers' only (`sparsemixer` in
models/phimoe); this is its inference path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _masked_pick(scores: jax.Array, logits: jax.Array, jitter_eps: float) -> tuple[jax.Array, jax.Array]:
    """The best of `scores` [N, E] (f32; -inf where already taken) and its softmax weight over the scores whose
    gap below it, relative to max(|logit|, best), is at most 2 * jitter_eps: ([N], [N] int32)."""
    best = jnp.max(scores, axis=-1, keepdims=True)
    expert = jnp.argmax(scores, axis=-1)
    # transformers measures the gap against the raw logits (the taken expert included), scaled by them
    factor = jnp.maximum(jnp.abs(logits), best)
    kept = jnp.where((best - logits) / factor > 2 * jitter_eps, -jnp.inf, scores)
    weight = jnp.take_along_axis(jax.nn.softmax(kept, axis=-1), expert[:, None], axis=-1)[:, 0]
    return weight, expert.astype(jnp.int32)


def sparsemixer(logits: jax.Array, jitter_eps: float) -> tuple[jax.Array, jax.Array]:
    """Routing weights [N, 2] (float32) and expert ids [N, 2] of router logits [N, E]."""
    logits = logits.astype(jnp.float32)
    first_weight, first = _masked_pick(logits, logits, jitter_eps)
    rest = jnp.where(jnp.arange(logits.shape[-1]) == first[:, None], -jnp.inf, logits)
    second_weight, second = _masked_pick(rest, logits, jitter_eps)
    return jnp.stack([first_weight, second_weight], axis=-1), jnp.stack([first, second], axis=-1)
