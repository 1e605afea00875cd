"""Rows that stand in for token embeddings: a vision-language model's image features at its
placeholder tokens (the prompt holds `image_token_id` where each image's rows go)."""

from __future__ import annotations

import dataclasses

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


def override_embeddings(x: jax.Array, override: EmbedOverride | None) -> jax.Array:
    """Embeddings x [B, T, D] with the override's rows where its mask is set (B * T == its T)."""
    if override is None:
        return x
    rows = override.rows.reshape(x.shape).astype(x.dtype)
    return jnp.where(override.mask.reshape(x.shape[:-1])[..., None], rows, x)
