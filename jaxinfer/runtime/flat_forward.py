"""A model's forward over one engine step's flat tokens, and the draft model that rides along.

The draft keeps its own page pool, indexed by the target's page tables (same page ids, same
page size), so the block manager's allocation, prefix sharing and preemption hold for both:
every program that writes the target's K/V for a token also runs `read_tokens`. (An EAGLE
head rides the same way: `eagle_rider`.)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.cache.ragged_view import RaggedPagedCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, forward_with_taps
from jaxinfer.models.embed_override import EmbedOverride
from jaxinfer.models.lora_weight import bind_token_slots, has_adapters
from jaxinfer.runtime.host_step import CATCH_UP_SPAN

if TYPE_CHECKING:
    from jaxinfer.runtime.engine_step import StepInputs



def step_hidden(
    weights: Weights, pages: PagedKVCache, x: "StepInputs", cfg: ModelConfig
) -> tuple[jax.Array, PagedKVCache]:
    """Final hidden states [N, D] of the step's flat tokens, and the pools with their K/V written."""
    hidden, _, pages = step_features(weights, pages, x, cfg, None)
    return hidden, pages


def step_view(pages: PagedKVCache, x: "StepInputs") -> RaggedPagedCache:
    """A pool as the step's flat tokens see it (the step's page tables; with Mamba2 layers or cross-attention,
    each token's slot)."""
    per_slot = pages.conv_states is not None or pages.cross_keys is not None
    token_slots = x.row_slots[x.token_rows] if per_slot else None
    return RaggedPagedCache(dataclasses.replace(pages, page_table=x.page_table), x.token_rows, token_slots=token_slots)


def step_features(
    weights: Weights, pages: PagedKVCache, x: "StepInputs", cfg: ModelConfig, taps: tuple[int, ...] | None,
    override: EmbedOverride | None = None,
) -> tuple[jax.Array, jax.Array | None, PagedKVCache]:
    """`step_hidden`, also returning the features [N, F] an EAGLE head reads (taps: the layers whose
    input it reads, `EagleConfig.feature_layers`; None: no features); override: image rows for the
    step's placeholder tokens (a vision-language model's)."""
    if has_adapters(weights):  # each token through its row's LoRA adapter
        weights = bind_token_slots(weights, x.adapters[x.token_rows], x.sampling.params.branchless)
    view = step_view(pages, x)
    if override is not None and override.key_ends is not None:  # image tokens see their whole image (Gemma 3)
        view = dataclasses.replace(view, key_ends=override.key_ends)
    streams = None if x.rope_offsets is None else (x.positions[:, None] + x.rope_offsets).T[:, None, :]
    hidden, tapped, view = forward_with_taps(weights, x.tokens[None], x.positions[None], view, cfg, taps or (),
                                             override, streams)
    features = None if taps is None else jnp.concatenate(tapped, axis=-1)[0] if taps else hidden[0]
    return hidden[0], features, dataclasses.replace(view.pages, page_table=pages.page_table)


def decode_inputs(x: "StepInputs", tokens: jax.Array, positions: jax.Array, live: jax.Array) -> "StepInputs":
    """One decode token per row at positions [R] (rows not live are padding)."""
    rows = positions.shape[0]
    index = jnp.arange(rows, dtype=jnp.int32)
    return dataclasses.replace(
        x, tokens=tokens, positions=jnp.where(live, positions, -1), token_rows=index,
        lengths=jnp.where(live, positions + 1, 0), query_lens=live.astype(jnp.int32), last_index=index,
    )


def catch_up_span(x: "StepInputs", start: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(first, end) [R] of the positions a verify call's catch-up reads: from start (the first
    unread) to the row's last token (the verify chunk's first), at most CATCH_UP_SPAN of them;
    rows that are padding read none."""
    last = x.lengths - x.query_lens
    end = jnp.minimum(last, start + CATCH_UP_SPAN)
    return jnp.where(x.query_lens > 0, start, end), end


def window_tokens(window: jax.Array, start: jax.Array, positions: jax.Array) -> jax.Array:
    """Tokens [R, N] at positions [R, N] from each row's window [R, CATCH_UP_WINDOW] (its tokens from start [R] on)."""
    index = jnp.clip(positions - start[:, None], 0, window.shape[1] - 1)
    return jnp.take_along_axis(window, index, axis=1)


def catch_up_inputs(x: "StepInputs", begin: jax.Array, end: jax.Array, chunk: int) -> "StepInputs":
    """Each row as one chunk of `chunk` positions from begin [R], those before end [R] live (the
    rest padding); tokens are the caller's to set."""
    rows = begin.shape[0]
    positions = begin[:, None] + jnp.arange(chunk, dtype=jnp.int32)[None, :]
    return dataclasses.replace(
        x, positions=jnp.where(positions < end[:, None], positions, -1).reshape(-1),
        token_rows=jnp.repeat(jnp.arange(rows, dtype=jnp.int32), chunk),
        lengths=jnp.where(begin < end, jnp.minimum(begin + chunk, end), x.lengths),
        query_lens=jnp.clip(end - begin, 0, chunk),
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DraftModel:
    """A draft model's page pool (the page table comes with each step) and shape; its weights
    travel beside it because the pool is donated to each step and they are not."""

    pages: PagedKVCache
    cfg: ModelConfig = dataclasses.field(metadata=dict(static=True))
    target_vocab: int = dataclasses.field(metadata=dict(static=True))


def read_tokens(draft: DraftModel | None, draft_weights: Weights | None, x: "StepInputs") -> DraftModel | None:
    """The draft with the step's tokens written into its pool (None passes through)."""
    if draft is None:
        return None
    _, pages = step_hidden(draft_weights, draft.pages, x, draft.cfg)
    return dataclasses.replace(draft, pages=pages)
