"""An EAGLE head as a proposer of the on-device loop: chain drafting from the target's features.

Alignment (see `eagle.py`): the head at position i reads (f_i, t_{i+1}) and proposes t_{i+2}. With
L tokens in a sequence the first draft (position L) comes from the head at L-2, which reads the
target's feature there. The state keeps the target features not yet fed to the head: `count`
positions ending at L-2 (after a round that accepted n drafts, the n+1 verified positions the
target just ran; after the prefill, the prompt's last position). Each round first feeds them in
one head pass (their K/V replaces what the chain wrote there from predicted features), then runs
the chain on its own predictions. Entries the head wrote past a sequence's end are overwritten
before any query can see them, as in the target's cache. Plain decode steps (target only) append
their feature to the pending ones, which keep the newest K+1: after a longer run of plain steps
the positions before those keep what the head last wrote there (drafts stay exact, only
acceptance can suffer).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.cache.contiguous import KVCache, init_cache
from jaxinfer.models import Weights
from jaxinfer.models.contiguous_decode import DecodeState
from jaxinfer.parallel.sharding import Layout
from jaxinfer.speculative.eagle import EagleConfig, EagleParams, head_logits, head_step, project_features
from jaxinfer.speculative.proposers import Proposal, draw_draft


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EagleState:
    """The head's one-layer cache and the target features it has not read yet."""

    cache: KVCache
    features: jax.Array  # [B, K+1, F] target features of the positions L-1-count .. L-2 (then padding)
    count: jax.Array  # [B] int32 in 1..K+1


@dataclasses.dataclass(frozen=True)
class EagleProposer:
    """Drafts with an EAGLE head over the target's features; q is the head's processed distribution."""

    ecfg: EagleConfig
    num_speculative_tokens: int
    draft_cost: float
    stateful: bool = True

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """EAGLE-1 reads the final hidden states, EAGLE-3 the input of three target layers."""
        return self.ecfg.feature_layers

    def init_state(self, batch: int, max_seq_len: int, dtype: Any, cpu_kernels: bool, layout: Layout) -> EagleState:
        """A zeroed head cache and no pending features."""
        cache = init_cache(self.ecfg.layer, batch, max_seq_len, dtype, cpu_kernels, layout)
        features = jnp.zeros((batch, self.num_speculative_tokens + 1, self.ecfg.feature_size), dtype)
        return EagleState(cache, features, jnp.ones((batch,), jnp.int32))

    def with_target(self, params: Any, target: Weights) -> EagleParams:
        """The head's weights with the target's embedding and LM head."""
        return EagleParams(params, target.embed, target.lm_head)

    def prefill(
        self, params: EagleParams, state: DecodeState, pstate: EagleState, prompt_bucket: int,
        features: jax.Array | None,
    ) -> EagleState:
        """Feed the prompt positions to the head; the last one (paired with the first new token) stays pending."""
        batch, seq = state.tokens.shape
        positions = jnp.broadcast_to(jnp.arange(prompt_bucket, dtype=jnp.int32), (batch, prompt_bucket))
        tokens = state.tokens[:, jnp.minimum(jnp.arange(prompt_bucket) + 1, seq - 1)]
        _, cache = head_step(params, tokens, project_features(params, features, self.ecfg), positions,
                             pstate.cache, self.ecfg)
        last = jnp.take_along_axis(features, jnp.maximum(state.lengths - 2, 0)[:, None, None], axis=1)  # P - 1
        pending = pstate.features.at[:, :1].set(last.astype(pstate.features.dtype))
        return EagleState(cache, pending, jnp.ones_like(pstate.count))

    def available(self, params: Any, state: DecodeState, pstate: Any, k: int) -> jax.Array:
        """A head can always propose k tokens."""
        return jnp.full(state.lengths.shape, k, jnp.int32)

    def after_plain(self, params: Any, pstate: EagleState, features: jax.Array) -> EagleState:
        """The plain step's feature [B, 1, F] (position L-1, the new L-2) joins the pending; the newest K+1 stay."""
        width = pstate.features.shape[1]
        full = (pstate.count >= width)[:, None, None]
        kept = jnp.where(full, jnp.roll(pstate.features, -1, axis=1), pstate.features)
        slot = jnp.minimum(pstate.count, width - 1)
        rows = jnp.arange(slot.shape[0])
        pending = kept.at[rows, slot].set(features[:, 0].astype(kept.dtype))
        return EagleState(pstate.cache, pending, jnp.minimum(pstate.count + 1, width))

    def resync(self, params: Any, state: DecodeState, pstate: EagleState, since: jax.Array) -> EagleState:
        """Nothing to do: the pending features are fed by the next `propose`."""
        return pstate

    def propose(
        self, params: EagleParams, state: DecodeState, pstate: EagleState, k: int, steps: jax.Array
    ) -> Proposal:
        """Catch up on the pending target features, then `steps` - 1 chain steps on the head's own predictions."""
        rows = jnp.arange(state.lengths.shape[0])
        lengths, seq = state.lengths, state.tokens.shape[1]
        start = jnp.maximum(lengths - 1 - pstate.count, 0)  # a finished row's count may run past 0
        positions = start[:, None] + jnp.arange(pstate.features.shape[1], dtype=jnp.int32)[None, :]
        tokens = state.tokens[rows[:, None], jnp.minimum(positions + 1, seq - 1)]
        inputs = project_features(params, pstate.features, self.ecfg)
        predicted, cache = head_step(params, tokens, inputs, positions, pstate.cache, self.ecfg)
        feature = predicted[rows, lengths - 2 - start]  # the head at L-2: predicts position L-1
        token, logprobs = draw_draft(head_logits(params, feature, self.ecfg), state, lengths)
        drafts = jnp.zeros((rows.shape[0], k), jnp.int32).at[:, 0].set(token)
        lps = jnp.full((rows.shape[0], k, logprobs.shape[-1]), -jnp.inf, jnp.float32).at[:, 0].set(logprobs)

        def step(carry: tuple) -> tuple:
            i, cache, feature, drafts, lps = carry
            pos = lengths + i - 2  # reads (predicted f_pos, draft i-1 at pos+1), proposes pos+2
            out, cache = head_step(params, drafts[:, i - 1][:, None], feature[:, None], pos[:, None], cache, self.ecfg)
            token, logprobs = draw_draft(head_logits(params, out[:, 0], self.ecfg), state, pos + 2)
            return i + 1, cache, out[:, 0], drafts.at[:, i].set(token), lps.at[:, i].set(logprobs)

        carry = (jnp.int32(1), cache, feature, drafts, lps)
        _, cache, _, drafts, lps = jax.lax.while_loop(lambda c: c[0] < steps, step, carry)
        return Proposal(drafts, lps, dataclasses.replace(pstate, cache=cache))

    def after_verify(self, params: Any, pstate: EagleState, hidden: jax.Array, num_accepted: jax.Array) -> EagleState:
        """The verified positions' features become pending: the n+1 that end at the new length - 2."""
        return EagleState(pstate.cache, hidden.astype(pstate.features.dtype), num_accepted + 1)
