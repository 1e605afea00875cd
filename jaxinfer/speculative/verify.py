"""The target side of a speculative round: one forward over k+1 positions, then the append.

`append_run` appends a variable number of tokens per sequence, cutting at the first stop token
and at max_tokens, so the cache (by lengths) and the token buffer always agree.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.cache.contiguous import KVCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, lm_logits
from jaxinfer.models.contiguous_decode import DecodeState
from jaxinfer.sampling.sampler import SamplingArrays
from jaxinfer.speculative.features import target_forward
from jaxinfer.speculative.rejection import Verdict, sampled_logprobs


def repeat_rows(params: SamplingArrays, times: int) -> SamplingArrays:
    """Each row's sampling parameters repeated `times` times (one per verified position)."""
    return jax.tree.map(lambda x: jnp.repeat(x, times, axis=0), params)


def verify_forward(
    weights: Weights, d: DecodeState, drafts: jax.Array, cfg: ModelConfig,
    feature_layers: tuple[int, ...] | None = None,
) -> tuple[jax.Array, jax.Array, KVCache]:
    """Target features [B, K+1, F] (see `features`) and processed logprobs [B, K+1, V] at positions
    length-1 .. length-1+K."""
    batch, k = drafts.shape
    last = d.tokens[jnp.arange(batch), d.lengths - 1]
    inputs = jnp.concatenate([last[:, None], drafts], axis=1)
    positions = (d.lengths - 1)[:, None] + jnp.arange(k + 1, dtype=jnp.int32)[None, :]
    hidden, features, cache = target_forward(weights, inputs, positions, d.cache, cfg, feature_layers)
    logits = lm_logits(weights, hidden)
    flat = sampled_logprobs(logits.reshape(batch * (k + 1), -1), repeat_rows(d.sampling, k + 1))
    return features, flat.reshape(logits.shape), cache


def accepted_run(drafts: jax.Array, verdict: Verdict) -> jax.Array:
    """Tokens [B, K+1] to append: the accepted drafts, then the correction or bonus token."""
    batch, k = drafts.shape
    padded = jnp.concatenate([drafts, jnp.zeros((batch, 1), drafts.dtype)], axis=1)
    j = jnp.arange(k + 1)[None, :]
    n = verdict.num_accepted[:, None]
    return jnp.where(j < n, padded, jnp.where(j == n, verdict.next_token[:, None], 0))


def append_run(state: DecodeState, run: jax.Array, run_len: jax.Array) -> tuple[DecodeState, jax.Array]:
    """Append run[:, :run_len] [B, T] to running sequences, cut after a stop token or at max length.

    Returns the new state and how many tokens [B] each sequence took.
    """
    active = ~state.done
    j = jnp.arange(run.shape[1])[None, :]
    is_stop = jnp.any(run[:, :, None] == state.stop_ids[:, None, :], axis=-1) & (j < run_len[:, None])
    through_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1) + 1, run.shape[1])
    room = state.max_lengths - state.lengths
    emitted = jnp.where(active, jnp.minimum(jnp.minimum(run_len, through_stop), room), 0).astype(jnp.int32)
    taken = j < emitted[:, None]
    write_at = jnp.where(taken, state.lengths[:, None] + j, state.tokens.shape[1])  # out of range: dropped
    tokens = state.tokens.at[jnp.arange(run.shape[0])[:, None], write_at].set(run, mode="drop")
    lengths = state.lengths + emitted
    hit_stop = jnp.any(is_stop & taken, axis=1)
    done = state.done | (active & (hit_stop | (lengths >= state.max_lengths)))
    return dataclasses.replace(state, tokens=tokens, lengths=lengths, done=done), emitted
