"""Per-request cross-attention keys and values of an encoder-decoder model (Whisper), kept in pages per row slot.

The decoder's cross-attention reads the same keys and values at every step of a request: its encoder's
output projected by each layer's k/v weights, [F, H, K] per layer for F encoder frames. They are computed
once, when the request's first chunk is scheduled (runtime/audio_runner), and written into the request's
row slot (runtime/row_slots: held while it runs). Each slot owns a fixed run of ceil(F / page_size) pages of
a cross page pool per layer, `PagedKVCache.cross_keys` / `cross_values` [KV, S * pages_per_slot, page_size, K]
in the pages' own storage (the layout the attention kernels read), so every step donates and keeps them as it
does the pages and Mamba2's states (cache/state_pool, the same slots), and a step's tokens attend them in
place: each token's page table is its slot's run (`cross_view`), its key length F, through the same paged
attention as self-attention (Pallas on GPU/TPU, XLA's blocked path on CPU). Nothing the size of
[tokens, F, H, K] is gathered. A preempted request recomputes: its encoder runs again when its first chunk is
scheduled again (the features stay with the request; the encoder's output does not).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxinfer.cache.paged import POOL_AXES, PagedKVCache
from jaxinfer.cache.ragged_view import RaggedPagedCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.parallel.sharding import Layout


def slot_pages(frames: int, page_size: int) -> int:
    """Pages a row slot's F encoder frames fill (the last one padded; its padding keys are never attended)."""
    return math.ceil(frames / page_size)


def with_cross(pages: PagedKVCache, cfg: ModelConfig, slots: int, layout: Layout) -> PagedKVCache:
    """pages with zeroed cross-attention page pools for `slots` row slots (unchanged for a decoder-only model)."""
    if not cfg.encoder_frames:
        return pages
    shape = (cfg.num_kv_heads, slots * slot_pages(cfg.encoder_frames, pages.page_size), pages.page_size,
             cfg.head_dim)
    made = lambda: [layout.zeros(shape, pages.k_pages[0].dtype, POOL_AXES) for _ in range(cfg.num_layers)]  # noqa: E731
    return dataclasses.replace(pages, cross_keys=made(), cross_values=made())


def cross_bytes(cfg: ModelConfig, slots: int, page_size: int, itemsize: int) -> int:
    """Device bytes of the cross-attention pages of `slots` row slots (0 for a decoder-only model)."""
    frames = slot_pages(cfg.encoder_frames, page_size) * page_size
    return 2 * slots * cfg.num_layers * frames * cfg.num_kv_heads * cfg.head_dim * itemsize


def write_cross(pages: PagedKVCache, slot: jax.Array, keys: list[jax.Array], values: list[jax.Array]
                ) -> PagedKVCache:
    """pages with row slot `slot`'s run of cross pages set from per layer keys and values [F, H, K]."""

    def put(pool: jax.Array, new: jax.Array) -> jax.Array:
        frames, page_size = new.shape[0], pool.shape[2]
        run = slot_pages(frames, page_size)
        padded = jnp.pad(new, ((0, run * page_size - frames), (0, 0), (0, 0)))
        paged = padded.reshape(run, page_size, *new.shape[1:]).transpose(2, 0, 1, 3)  # [KV, run, page_size, K]
        written = jax.lax.dynamic_update_slice_in_dim(pool, pages.to_storage(paged), slot * run, axis=1)
        return pages.layout.constrain(written, POOL_AXES)

    return dataclasses.replace(pages, cross_keys=[put(p, k) for p, k in zip(pages.cross_keys, keys)],
                               cross_values=[put(p, v) for p, v in zip(pages.cross_values, values)])


def cross_view(cache: RaggedPagedCache, layer: int, frames: int) -> PagedKVCache:
    """Layer `layer`'s cross pages as a one-layer page pool whose page table [T, pages_per_slot] gives each of
    the step's flat tokens its row slot's run (read in place: nothing is gathered per token).

    Only the engine's ragged steps hold them: a whole-sequence pass (prompt logprobs, `LLM.logits`) of an
    encoder-decoder model is refused before it is built."""
    if not isinstance(cache, RaggedPagedCache) or cache.pages.cross_keys is None:
        raise ValueError("cross-attention runs only in the engine's steps (its keys live per row slot)")
    pages = cache.pages
    run = slot_pages(frames, pages.page_size)
    table = cache.token_slots[:, None] * run + jnp.arange(run, dtype=jnp.int32)[None, :]
    return dataclasses.replace(pages, k_pages=[pages.cross_keys[layer]], v_pages=[pages.cross_values[layer]],
                               page_table=table, conv_states=None, ssm_states=None, cross_keys=None,
                               cross_values=None)
