"""Draft proposers: a draft model with its own KV cache, and n-gram prompt lookup.

A proposer is a hashable object (a static argument of the compiled loop) whose methods are pure
functions of its parameters (e.g. draft weights), the target's DecodeState and its own state
pytree. EAGLE heads (`eagle_proposer.py`) implement the same protocol: `feature_layers` asks the
prefill and every verify pass for target features, which `prefill` and `after_verify` receive.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from jaxinfer.cache.contiguous import init_cache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, forward, lm_logits
from jaxinfer.models.contiguous_decode import DecodeState
from jaxinfer.parallel.sharding import Layout
from jaxinfer.speculative.rejection import DRAFT_TAG, draw, one_hot_logprobs, position_keys, sampled_logprobs

RESYNC_CHUNK = 16  # tokens per draft forward when a draft model catches up after plain steps


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Proposal:
    """Up to K drafted tokens per sequence and the distribution each was drawn from."""

    tokens: jax.Array  # [B, K] int32; token i is proposed for position length + i
    logprobs: jax.Array  # [B, K, V] float32 processed q (one-hot for deterministic proposers)
    state: Any  # the proposer's state after drafting


class Proposer(Protocol):
    """What the speculative loop needs from a source of draft tokens."""

    # True when the proposer keeps a cache that must see every token: plain steps (target only)
    # leave it behind, and `after_plain` / `resync` bring it up to date before the next round.
    stateful: bool
    # Cost of drafting one token relative to one target decode step (adaptive k uses it).
    draft_cost: float
    # Target features it reads (see `features.py`): None for none, () for the final hidden states.
    feature_layers: tuple[int, ...] | None

    def init_state(self, batch: int, max_seq_len: int, dtype: Any, cpu_kernels: bool, layout: Layout) -> Any:
        """A fresh state for `batch` sequences (None for a stateless proposer)."""
        ...

    def with_target(self, params: Any, target: Weights) -> Any:
        """The parameters the compiled loop hands the other methods (an EAGLE head adds the target's embedding)."""
        ...

    def prefill(
        self, params: Any, state: DecodeState, pstate: Any, prompt_bucket: int, features: jax.Array | None
    ) -> Any:
        """Proposer state after reading the prompts (the first prompt_bucket buffer slots).

        features [B, prompt_bucket, F]: the target's features there when `feature_layers` is not None.
        """
        ...

    def available(self, params: Any, state: DecodeState, pstate: Any, k: int) -> jax.Array:
        """How many tokens [B] int32 (<= k) the proposer can draft for each sequence now."""
        ...

    def after_plain(self, params: Any, pstate: Any, features: jax.Array) -> Any:
        """State after a plain decode step whose target features [B, 1, F] the step computed."""
        ...

    def resync(self, params: Any, state: DecodeState, pstate: Any, since: jax.Array) -> Any:
        """State caught up with the tokens plain steps appended since the sequences held `since` [B]."""
        ...

    def propose(self, params: Any, state: DecodeState, pstate: Any, k: int, steps: jax.Array) -> Proposal:
        """Draft up to k tokens per sequence; `steps` [] bounds the work this round (the longest plan).

        Tokens past a sequence's `available` count or past `steps` are ignored by the verifier.
        """
        ...

    def after_verify(self, params: Any, pstate: Any, hidden: jax.Array, num_accepted: jax.Array) -> Any:
        """Update state from the target features [B, K+1, F] of the verified positions and acceptance [B]."""
        ...


@dataclasses.dataclass(frozen=True)
class DraftModelProposer:
    """A smaller model of the same tokenizer drafting autoregressively from its own KV cache.

    Cache invariant: positions 0..length-3 are valid, so each round first feeds the two newest
    tokens (positions length-2 and length-1). That keeps the cache complete whether the round
    ended in a rejection or accepted all k drafts, without an extra draft step per round. Plain
    steps skip the draft (it would cost a draft step each); `resync` feeds what they appended
    in chunks of RESYNC_CHUNK tokens when speculation resumes.
    """

    cfg: ModelConfig
    target_vocab: int
    draft_cost: float
    stateful: bool = True
    feature_layers: None = None

    def init_state(self, batch: int, max_seq_len: int, dtype: Any, cpu_kernels: bool, layout: Layout) -> Any:
        """A zeroed draft cache."""
        return init_cache(self.cfg, batch, max_seq_len, dtype, cpu_kernels, layout)

    def with_target(self, params: Any, target: Weights) -> Any:
        """The draft's own weights."""
        return params

    def prefill(
        self, params: Any, state: DecodeState, pstate: Any, prompt_bucket: int, features: jax.Array | None
    ) -> Any:
        """Write the prompts into the draft cache."""
        tokens = state.tokens[:, :prompt_bucket]
        positions = jnp.broadcast_to(jnp.arange(prompt_bucket, dtype=jnp.int32), tokens.shape)
        _, cache = forward(params, tokens, positions, pstate, self.cfg)
        return cache

    def available(self, params: Any, state: DecodeState, pstate: Any, k: int) -> jax.Array:
        """A draft model can always propose k tokens."""
        return jnp.full(state.lengths.shape, k, jnp.int32)

    def after_plain(self, params: Any, pstate: Any, features: jax.Array) -> Any:
        """Nothing per plain step: `resync` catches up once speculation resumes."""
        return pstate

    def resync(self, params: Any, state: DecodeState, pstate: Any, since: jax.Array) -> Any:
        """Feed positions since-2 .. length-3 (what plain steps appended) to the draft cache.

        Chunk slots past a row's range get position -1: their K/V is dropped and they attend to nothing.
        """
        rows = jnp.arange(state.lengths.shape[0])[:, None]
        first = jnp.maximum(since - 2, 0)
        stop = jnp.maximum(state.lengths - 2, first)  # exclusive
        last_slot = state.tokens.shape[1] - 1

        def chunk(carry: tuple) -> tuple:
            offset, cache = carry
            positions = (first + offset)[:, None] + jnp.arange(RESYNC_CHUNK, dtype=jnp.int32)[None, :]
            tokens = state.tokens[rows, jnp.minimum(positions, last_slot)]
            _, cache = forward(params, tokens, jnp.where(positions < stop[:, None], positions, -1), cache, self.cfg)
            return offset + RESYNC_CHUNK, cache

        carry = (jnp.int32(0), pstate)
        return jax.lax.while_loop(lambda c: jnp.any(first + c[0] < stop), chunk, carry)[1]

    def propose(self, params: Any, state: DecodeState, pstate: Any, k: int, steps: jax.Array) -> Proposal:
        """`steps` (<= k) autoregressive draft steps, each token drawn from the processed draft distribution.

        Slots past `steps` stay token 0 with no probability mass; the verifier masks them.
        """
        rows = jnp.arange(state.lengths.shape[0])
        lengths = state.lengths
        first_pos = jnp.stack([jnp.maximum(lengths - 2, 0), lengths - 1], axis=1)
        hidden, cache = forward(params, state.tokens[rows[:, None], first_pos], first_pos, pstate, self.cfg)
        token, logprobs = self._draw(params, hidden[:, -1], state, lengths)
        tokens = jnp.zeros((rows.shape[0], k), jnp.int32).at[:, 0].set(token)
        lps = jnp.full((rows.shape[0], k, logprobs.shape[-1]), -jnp.inf, jnp.float32).at[:, 0].set(logprobs)

        def step(carry: tuple) -> tuple:
            i, cache, tokens, lps = carry
            pos = lengths + i - 1
            hidden, cache = forward(params, tokens[:, i - 1][:, None], pos[:, None], cache, self.cfg)
            token, logprobs = self._draw(params, hidden[:, 0], state, pos + 1)
            return i + 1, cache, tokens.at[:, i].set(token), lps.at[:, i].set(logprobs)

        # A while loop, so rounds that want short drafts (low acceptance) pay for short drafts.
        carry = (jnp.int32(1), cache, tokens, lps)
        _, cache, tokens, lps = jax.lax.while_loop(lambda c: c[0] < steps, step, carry)
        return Proposal(tokens, lps, cache)

    def after_verify(self, params: Any, pstate: Any, hidden: jax.Array, num_accepted: jax.Array) -> Any:
        """The draft cache needs nothing from the target: rollback is the length reset."""
        return pstate

    def _draw(self, params: Any, hidden: jax.Array, state: DecodeState, positions: jax.Array) -> tuple:
        """Draft token [B] for `positions` and its processed distribution [B, V_target]."""
        logits = lm_logits(params, hidden)
        pad = self.target_vocab - self.cfg.vocab_size
        if pad:  # the draft's vocabulary is a prefix of the target's: extra ids are impossible
            logits = jnp.pad(logits, ((0, 0), (0, pad)), constant_values=-jnp.inf)
        return draw_draft(logits, state, positions)


def draw_draft(logits: jax.Array, state: DecodeState, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Draft token [B] for `positions` [B] from logits [B, V], and its processed distribution q [B, V]."""
    logprobs = sampled_logprobs(logits, state.sampling)
    keys = position_keys(state.sampling, positions[:, None], DRAFT_TAG)[:, 0]
    return draw(logprobs, state.sampling, keys), logprobs


@dataclasses.dataclass(frozen=True)
class NgramProposer:
    """Prompt lookup: find the last n tokens earlier in prompt+output and propose what followed.

    Longer n-grams win; among matches the latest one with k tokens after it wins (so a loop of
    period 1 still yields k tokens), else the latest match. Deterministic: q is one-hot.
    """

    vocab_size: int
    ngram_min: int
    ngram_max: int
    draft_cost: float
    stateful: bool = False
    feature_layers: None = None

    def init_state(self, batch: int, max_seq_len: int, dtype: Any, cpu_kernels: bool, layout: Layout) -> Any:
        """No state."""
        return None

    def with_target(self, params: Any, target: Weights) -> Any:
        """No parameters."""
        return params

    def prefill(
        self, params: Any, state: DecodeState, pstate: Any, prompt_bucket: int, features: jax.Array | None
    ) -> Any:
        """Prompt lookup reads the token buffer directly; no state."""
        return pstate

    def available(self, params: Any, state: DecodeState, pstate: Any, k: int) -> jax.Array:
        """Tokens that follow the chosen match (0 where nothing matches)."""
        return self.lookup(state.tokens, state.lengths, k)[1]

    def after_plain(self, params: Any, pstate: Any, features: jax.Array) -> Any:
        """Stateless."""
        return pstate

    def resync(self, params: Any, state: DecodeState, pstate: Any, since: jax.Array) -> Any:
        """Stateless: lookup reads the token buffer."""
        return pstate

    def propose(self, params: Any, state: DecodeState, pstate: Any, k: int, steps: jax.Array) -> Proposal:
        """The continuation of the chosen match, as one-hot distributions (lookup is cheap: steps unused)."""
        tokens, _ = self.lookup(state.tokens, state.lengths, k)
        return Proposal(tokens, one_hot_logprobs(tokens, self.vocab_size), pstate)

    def after_verify(self, params: Any, pstate: Any, hidden: jax.Array, num_accepted: jax.Array) -> Any:
        """Stateless."""
        return pstate

    def lookup(self, tokens: jax.Array, lengths: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
        """Proposal [B, k] and its usable length [B] for buffers tokens [B, S] holding `lengths` tokens."""
        batch, seq = tokens.shape
        rows = jnp.arange(batch)[:, None]
        ends = jnp.arange(seq)[None, :]
        best = jnp.full((batch,), -1, jnp.int32)
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            # match[b, j]: tokens j-n+1..j equal the last n tokens, and j precedes the last token.
            match = (ends >= n - 1) & (ends < lengths[:, None] - 1)
            for m in range(n):
                last = tokens[rows[:, 0], jnp.maximum(lengths - 1 - m, 0)]
                match &= jnp.roll(tokens, m, axis=1) == last[:, None]
            full = match & (ends <= lengths[:, None] - 1 - k)
            latest_full = jnp.max(jnp.where(full, ends, -1), axis=1)
            latest = jnp.max(jnp.where(match, ends, -1), axis=1)
            end = jnp.where(latest_full >= 0, latest_full, latest)
            best = jnp.where((best < 0) & (lengths > n), end, best).astype(jnp.int32)
        count = jnp.where(best >= 0, jnp.minimum(k, lengths - 1 - best), 0).astype(jnp.int32)
        index = jnp.clip(best[:, None] + 1 + jnp.arange(k)[None, :], 0, seq - 1)
        proposal = jnp.where(jnp.arange(k)[None, :] < count[:, None], tokens[rows, index], 0)
        return proposal, count
