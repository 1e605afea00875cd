"""Logits at every position of whole sequences over a contiguous cache (prompt logprobs, `LLM.logits`),
and pooled final hidden states (`LLM.embed`), through a classifier's head (`LLM.classify`, `LLM.score`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.cache.contiguous import KVCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, forward, forward_with_taps, lm_logits
from jaxinfer.models.embed_override import EmbedOverride


def all_logits(weights: Weights, tokens: jax.Array, cache: KVCache, cfg: ModelConfig,
               override: EmbedOverride | None = None, rope_offsets: jax.Array | None = None) -> jax.Array:
    """Float32 next-token logits [B, T, V] at every position of tokens [B, T] (from position 0); override: rows
    replacing some tokens' embeddings (a vision-language model's image features, B * T of them); rope_offsets
    [B, T, 3]: an M-RoPE model's rotary offsets of each token (runtime/mrope_positions)."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    streams = None if rope_offsets is None else jnp.moveaxis(positions[..., None] + rope_offsets, -1, 0)
    hidden, _, _ = forward_with_taps(weights, tokens, positions, cache, cfg, (), override, streams)
    return lm_logits(weights, hidden)


def pooled_hidden(
    weights: Weights, tokens: jax.Array, lengths: jax.Array, cache: KVCache, head: jax.Array | None, cfg: ModelConfig,
    pooling: str,
) -> jax.Array:
    """Float32 [B, D]: the final hidden states of tokens [B, T] (row b's first lengths[b] real, the rest
    padding) pooled per row: "last" (the last real token's, as decoder embedding models read them), "mean"
    (over the real tokens) or "cls" (the first token's). Causal attention keeps padding out of real positions.
    head: a classifier's [num_labels, D], giving its float32 logits [B, num_labels] instead."""
    steps = jnp.arange(tokens.shape[1], dtype=jnp.int32)
    hidden = forward(weights, tokens, jnp.broadcast_to(steps, tokens.shape), cache, cfg)[0].astype(jnp.float32)
    if pooling == "last":
        pooled = jnp.take_along_axis(hidden, (lengths - 1)[:, None, None], axis=1)[:, 0]
    elif pooling == "cls":
        pooled = hidden[:, 0]
    else:
        real = (steps[None, :] < lengths[:, None])[..., None]
        pooled = jnp.sum(jnp.where(real, hidden, 0.0), axis=1) / lengths[:, None]
    return pooled if head is None else jnp.einsum("bd,ld->bl", pooled, head.astype(jnp.float32))
