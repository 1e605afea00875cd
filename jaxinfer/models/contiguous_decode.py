"""Prefill and the on-device decode loop, as pure functions of (weights, state).

The state holds the whole token buffer (prompt + output) per sequence, so the host only reads
results when a loop call returns. Invariant: the cache holds positions 0..length-2 and the
token at length-1 is the next one to feed.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.cache.contiguous import KVCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, forward, lm_logits
from jaxinfer.sampling.sampler import SamplingArrays, sample


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DecodeState:
    """Everything the decode loop carries between tokens."""

    tokens: jax.Array  # [B, S] int32 prompt then generated tokens
    lengths: jax.Array  # [B] int32 tokens in `tokens`
    max_lengths: jax.Array  # [B] int32 stop once lengths reaches this
    done: jax.Array  # [B] bool
    stop_ids: jax.Array  # [B, NS] int32, -1 padded
    sampling: SamplingArrays
    cache: KVCache


def append_tokens(state: DecodeState, new_tokens: jax.Array) -> DecodeState:
    """Append new_tokens [B] to the sequences still running and update their done flags."""
    active = ~state.done
    batch = jnp.arange(new_tokens.shape[0])
    write_at = jnp.where(active, state.lengths, state.tokens.shape[1])  # out of range: dropped
    tokens = state.tokens.at[batch, write_at].set(new_tokens, mode="drop")
    lengths = state.lengths + active.astype(jnp.int32)
    hit_stop = jnp.any(new_tokens[:, None] == state.stop_ids, axis=-1)
    done = state.done | (active & (hit_stop | (lengths >= state.max_lengths)))
    return dataclasses.replace(state, tokens=tokens, lengths=lengths, done=done)


def last_hidden_logits(weights: Weights, hidden: jax.Array, index: jax.Array) -> jax.Array:
    """Logits [B, V] of the hidden state at index [B] along the time axis of hidden [B, T, D]."""
    picked = jnp.take_along_axis(hidden, index[:, None, None], axis=1)[:, 0]
    return lm_logits(weights, picked)


def prefill(weights: Weights, state: DecodeState, cfg: ModelConfig, prompt_bucket: int) -> DecodeState:
    """Run the prompts (the first prompt_bucket buffer slots) and sample each first new token."""
    tokens = state.tokens[:, :prompt_bucket]
    positions = jnp.broadcast_to(jnp.arange(prompt_bucket, dtype=jnp.int32), tokens.shape)
    hidden, cache = forward(weights, tokens, positions, state.cache, cfg)
    logits = last_hidden_logits(weights, hidden, state.lengths - 1)
    new_tokens = sample(logits, state.sampling, state.lengths)
    return append_tokens(dataclasses.replace(state, cache=cache), new_tokens)


def decode_step(weights: Weights, state: DecodeState, cfg: ModelConfig) -> DecodeState:
    """Feed each sequence's last token, sample the next one and append it."""
    batch = jnp.arange(state.lengths.shape[0])
    positions = state.lengths - 1
    last = state.tokens[batch, positions]
    hidden, cache = forward(weights, last[:, None], positions[:, None], state.cache, cfg)
    new_tokens = sample(lm_logits(weights, hidden[:, 0]), state.sampling, state.lengths)
    return append_tokens(dataclasses.replace(state, cache=cache), new_tokens)


def decode_loop(weights: Weights, state: DecodeState, num_steps: jax.Array, cfg: ModelConfig) -> DecodeState:
    """Up to num_steps decode steps in one lax.while_loop; stops early when every sequence is done."""

    def cond(carry: tuple[jax.Array, DecodeState]) -> jax.Array:
        step, s = carry
        return (step < num_steps) & ~jnp.all(s.done)

    def body(carry: tuple[jax.Array, DecodeState]) -> tuple[jax.Array, DecodeState]:
        step, s = carry
        return step + 1, decode_step(weights, s, cfg)

    _, state = jax.lax.while_loop(cond, body, (jnp.int32(0), state))
    return state


def all_logits(weights: Weights, tokens: jax.Array, cache: KVCache, cfg: ModelConfig) -> jax.Array:
    """Float32 next-token logits [B, T, V] at every position of tokens [B, T] (from position 0)."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    hidden, _ = forward(weights, tokens, positions, cache, cfg)
    return lm_logits(weights, hidden)
