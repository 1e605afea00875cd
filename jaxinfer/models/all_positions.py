"""Logits at every position of whole sequences over a contiguous cache (prompt logprobs, `LLM.logits`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.cache.contiguous import KVCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, forward, lm_logits


def all_logits(weights: Weights, tokens: jax.Array, cache: KVCache, cfg: ModelConfig) -> jax.Array:
    """Float32 next-token logits [B, T, V] at every position of tokens [B, T] (from position 0)."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    hidden, _ = forward(weights, tokens, positions, cache, cfg)
    return lm_logits(weights, hidden)
