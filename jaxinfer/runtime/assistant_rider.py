"""A Gemma 4 assistant (speculative/gemma4_assistant) drafting inside the serving engine.

The assistant has no K/V of its own: each of its layers attends to the target's K/V of one target layer
(`AssistantConfig.reads`), which the engine keeps in the target's page pools, so a draft reads the target's
pages through the row's page table (the keys before P, P the position of the row's last token t_P, which the
verify pass has not written yet). Its other input is the target's final post-norm hidden state at P - 1: the
rider keeps one pool of those per position (`features`), indexed by the target's page tables like an EAGLE
head's, so prefix sharing, preemption and recompute hold for it. Every target step stores the states of the
positions it computes (prefill chunks, plain decode calls, verified chunks), so there is nothing to catch up:
P - 1 is always a position the target computed in this engine (a cached prefix never holds a row's last prompt
token, and a rejected draft's state at P' is rewritten when P' is computed again before it is read).
A draft round runs the assistant k times at the same position P, each step reading the token drafted before
and the state the step before returned, as transformers' SinglePositionMultiTokenCandidateGenerator does.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.models.attention import gathered_rows_attend, paged_rows_attend
from jaxinfer.runtime.position_pool import pool_index, store_at
from jaxinfer.speculative.eagle import EagleParams
from jaxinfer.speculative.gemma4_assistant import AssistantConfig, TargetAttention, assistant_forward
from jaxinfer.speculative.rejection import DRAFT_TAG, draw, position_keys, sampled_logprobs

if TYPE_CHECKING:
    from jaxinfer.runtime.engine_step import StepInputs


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class AssistantDraft:
    """The assistant's one pool; its weights (`EagleParams.head`, with the target's embedding) travel beside it."""

    # [pages, page_size, B] the target's final post-norm hidden state at every position; float32 on CPU (a
    # 16-bit scatter copies the whole buffer there, as for an EAGLE head's pools), the model's dtype elsewhere
    features: jax.Array
    acfg: AssistantConfig = dataclasses.field(metadata=dict(static=True))
    dtype: str = dataclasses.field(metadata=dict(static=True))  # the assistant's compute dtype


def remember(draft: AssistantDraft, x: "StepInputs", features: jax.Array) -> AssistantDraft:
    """The rider with the target's final hidden states [N, B] of x's flat tokens stored (padding stores nothing)."""
    stored = store_at(draft.features, x.page_table[x.token_rows], x.positions, features)
    return dataclasses.replace(draft, features=stored)


def target_attention(draft: AssistantDraft, pages: PagedKVCache, x: "StepInputs", start: jax.Array,
                     live: jax.Array) -> TargetAttention:
    """Attention of each row's query at start [R] (P) over the target's keys before it, in the target's pages:
    a paged decode of P keys (its query taken at P - 1), a sliding layer's window one wider to read the last
    window + 1 keys as HF's flipped window does; rows not live attend nothing."""
    acfg = draft.acfg
    rows_attend = gathered_rows_attend if pages.backend == "reference" else paged_rows_attend
    lengths, query_lens = jnp.maximum(start, 1), live.astype(jnp.int32)

    def attend(layer: int, q: jax.Array) -> jax.Array:
        window = acfg.layers.layer_windows[layer]
        return rows_attend(q, pages, acfg.reads[layer], window + 1 if window else 0, lengths, x.page_table,
                           query_lens, acfg.layers.attn_scale)

    return attend


def propose(
    draft: AssistantDraft, params: EagleParams, pages: PagedKVCache, x: "StepInputs", count: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Drafts [R, C-1] and their processed distributions [R, C-1, V].

    x is the verify layout (every row one chunk of C tokens starting with its last token t_P at P = L-1); row r
    drafts count[r] tokens, every step at P: the first from (t_P, the target's state at P - 1), each next one
    from (the draft before, the state the step before returned).
    """
    rows = x.lengths.shape[0]
    chunk = x.tokens.shape[0] // rows
    start = x.lengths - x.query_lens
    live = x.query_lens > 0
    params_s = x.sampling.params
    vocab = draft.acfg.layers.vocab_size
    attend = target_attention(draft, pages, x, start, live)
    page, slot = pool_index(draft.features, x.page_table, jnp.maximum(start - 1, 0))
    state = draft.features[page, slot].astype(draft.dtype)

    def step(carry: tuple) -> tuple:
        i, state, token, tokens, logprobs = carry
        state, logits = assistant_forward(params.head, draft.acfg, params.embed, token, state, start, attend)
        q = sampled_logprobs(logits, params_s)
        token = draw(q, params_s, position_keys(params_s, (start + i + 1)[:, None], DRAFT_TAG)[:, 0])
        wanted = (i < count)[:, None]
        slot = jnp.minimum(i, chunk - 2)
        tokens = tokens.at[:, slot].set(jnp.where(wanted[:, 0], token, tokens[:, slot]))
        logprobs = logprobs.at[:, slot].set(jnp.where(wanted, q, logprobs[:, slot]))
        return i + 1, state, token, tokens, logprobs

    carry = (jnp.int32(0), state, x.tokens.reshape(rows, chunk)[:, 0], jnp.zeros((rows, chunk - 1), jnp.int32),
             jnp.full((rows, chunk - 1, vocab), -jnp.inf, jnp.float32))
    if params_s.branchless:  # steps past a row's count are computed and not kept
        carry = jax.lax.fori_loop(0, chunk - 1, lambda _, c: step(c), carry)
    else:
        calls = jnp.max(jnp.where(live, count, 0))
        carry = jax.lax.while_loop(lambda c: c[0] < calls, step, carry)
    return carry[3], carry[4]
