"""Rows that stand in for token embeddings: a vision-language model's image features at its
placeholder tokens (the prompt holds `image_token_id` where each image's rows go); and Qwen3-VL's
DeepStack rows, added to the hidden states at those tokens after each of the first K layers.

A request's image rows travel as one row per placeholder, DeepStack's K beside the embedding's
([T, (1 + K) * D]: `stacked_override` splits them), so the host carries them, chunks them and
keeps them across preemption as it does any image rows: a chunk cutting an image takes its part
of all K + 1. Other models' overrides have no DeepStack leaf (their step programs are unchanged).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EmbedOverride:
    """Per flat token a row to use instead of its embedding, where `mask` is set."""

    rows: jax.Array  # [T, D] float32 (cast to the model's dtype where used)
    mask: jax.Array  # [T] bool
    # [T] int32: each token's image end where its image's tokens see each other both ways (Gemma 3), 0 elsewhere
    key_ends: jax.Array | None = None
    deepstack: jax.Array | None = None  # [K, T, D] float32: added after layer k < K where `mask` is set (Qwen3-VL)


def stacked_override(rows: Any, mask: Any, hidden_size: int, key_ends: Any = None) -> EmbedOverride:
    """The override of rows [T, (1 + K) * D] (host or device arrays): the first D columns replace the
    embeddings, the next K groups of D are DeepStack's (none when K is 0)."""
    layers = rows.shape[1] // hidden_size - 1
    if layers == 0:
        return EmbedOverride(rows, mask, key_ends)
    deepstack = rows[:, hidden_size:].reshape(rows.shape[0], layers, hidden_size).transpose(1, 0, 2)
    return EmbedOverride(rows[:, :hidden_size], mask, key_ends, deepstack)


def override_embeddings(x: jax.Array, override: EmbedOverride | None) -> jax.Array:
    """Embeddings x [B, T, D] with the override's rows where its mask is set (B * T == its T)."""
    if override is None:
        return x
    rows = override.rows.reshape(x.shape).astype(x.dtype)
    return jnp.where(override.mask.reshape(x.shape[:-1])[..., None], rows, x)


def placeholders_as(tokens: jax.Array, override: EmbedOverride | None, token: int) -> jax.Array:
    """tokens [B, T] with `token` where the override's mask is set: Gemma 4's per-layer inputs read an image token
    as the pad token (HF's Gemma4Model looks the pad's up there; the image's rows still feed their other part)."""
    if override is None:
        return tokens
    return jnp.where(override.mask.reshape(tokens.shape), jnp.asarray(token, tokens.dtype), tokens)


def add_deepstack(x: jax.Array, override: EmbedOverride | None, layer: int) -> jax.Array:
    """Hidden states x [B, T, D] leaving `layer`, plus its DeepStack rows at the image tokens (layer < K)."""
    if override is None or override.deepstack is None or layer >= override.deepstack.shape[0]:
        return x
    rows = override.deepstack[layer].reshape(x.shape).astype(x.dtype)
    return jnp.where(override.mask.reshape(x.shape[:-1])[..., None], x + rows, x)
