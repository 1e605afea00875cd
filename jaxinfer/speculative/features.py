"""Target features for proposers that read them (EAGLE heads), from the prefill and the verify pass.

A proposer's `feature_layers` says what it reads: None nothing, () the target's final
(post-norm) hidden states [.., D], (i, j, l) the residual stream entering those layers,
concatenated [.., 3D] (EAGLE-3).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.cache.contiguous import KVCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, forward_with_taps
from jaxinfer.models.contiguous_decode import DecodeState, append_tokens, last_hidden_logits
from jaxinfer.sampling.sampler import sample


def target_forward(
    weights: Weights, tokens: jax.Array, positions: jax.Array, cache: KVCache, cfg: ModelConfig,
    feature_layers: tuple[int, ...] | None,
) -> tuple[jax.Array, jax.Array, KVCache]:
    """The target on tokens [B, T]: final hidden [B, T, D], the features a proposer reads [B, T, F], the cache."""
    hidden, taps, cache = forward_with_taps(weights, tokens, positions, cache, cfg, feature_layers or ())
    return hidden, jnp.concatenate(taps, axis=-1) if feature_layers else hidden, cache


def prefill_features(
    weights: Weights, state: DecodeState, cfg: ModelConfig, prompt_bucket: int, feature_layers: tuple[int, ...]
) -> tuple[DecodeState, jax.Array]:
    """`generation.prefill`, also returning the features [B, prompt_bucket, F] of every prompt position."""
    tokens = state.tokens[:, :prompt_bucket]
    positions = jnp.broadcast_to(jnp.arange(prompt_bucket, dtype=jnp.int32), tokens.shape)
    hidden, features, cache = target_forward(weights, tokens, positions, state.cache, cfg, feature_layers)
    new_tokens = sample(last_hidden_logits(weights, hidden, state.lengths - 1), state.sampling, state.lengths)
    return append_tokens(dataclasses.replace(state, cache=cache), new_tokens), features
