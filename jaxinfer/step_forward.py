"""A model's forward over one engine step's flat tokens, and the draft model that rides along.

The draft keeps its own page pool, indexed by the target's page tables (same page ids, same
page size), so the block manager's allocation, prefix sharing and preemption hold for both:
every program that writes the target's K/V for a token also runs `read_tokens`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax

from jaxinfer.config import ModelConfig
from jaxinfer.models import Weights, forward
from jaxinfer.paged_kv_cache import PagedKVCache
from jaxinfer.ragged_cache import RaggedPagedCache

if TYPE_CHECKING:
    from jaxinfer.batch_step import StepInputs


def step_hidden(
    weights: Weights, pages: PagedKVCache, x: "StepInputs", cfg: ModelConfig
) -> tuple[jax.Array, PagedKVCache]:
    """Final hidden states [N, D] of the step's flat tokens, and the pools with their K/V written."""
    view = RaggedPagedCache(
        dataclasses.replace(pages, page_table=x.page_table), x.token_rows, x.lengths, x.query_lens, x.num_decode
    )
    hidden, view = forward(weights, x.tokens[None], x.positions[None], view, cfg)
    return hidden[0], dataclasses.replace(view.pages, page_table=pages.page_table)


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
