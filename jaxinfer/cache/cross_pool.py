"""Per-request cross-attention keys and values of an encoder-decoder model (Whisper), kept per row slot.

The decoder's cross-attention reads the same keys and values at every step of a request: its encoder's
output projected by each layer's k/v weights, [F, H, K] per layer for F encoder frames. They are computed
once, when the request's first chunk is scheduled (runtime/audio_runner), and written into the request's
row slot (runtime/row_slots: held while it runs), in `PagedKVCache.cross_keys` / `cross_values`, per layer
[S, F, H, K] in the model's dtype, so every step donates and keeps them as it does the pages and Mamba2's
states (cache/state_pool, the same slots). A preempted request recomputes: its encoder runs again when its
first chunk is scheduled again (the features stay with the request; the encoder's output does not).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.cache.ragged_view import RaggedPagedCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.parallel.sharding import Layout

CROSS_AXES = (None, None, "kv_heads", "head_dim")  # [S, F, H, K]


def with_cross(pages: PagedKVCache, cfg: ModelConfig, slots: int, layout: Layout) -> PagedKVCache:
    """pages with zeroed cross-attention pools of `slots` row slots (unchanged for a decoder-only model)."""
    if not cfg.encoder_frames:
        return pages
    shape = (slots, cfg.encoder_frames, cfg.num_kv_heads, cfg.head_dim)
    dtype = pages.value_dtype if pages.bits_of is None else jnp.dtype(pages.bits_of)
    made = lambda: [layout.zeros(shape, dtype, CROSS_AXES) for _ in range(cfg.num_layers)]  # noqa: E731
    return dataclasses.replace(pages, cross_keys=made(), cross_values=made())


def cross_bytes(cfg: ModelConfig, slots: int, itemsize: int) -> int:
    """Device bytes of the cross-attention pools of `slots` row slots (0 for a decoder-only model)."""
    return 2 * slots * cfg.num_layers * cfg.encoder_frames * cfg.num_kv_heads * cfg.head_dim * itemsize


def write_cross(pages: PagedKVCache, slot: jax.Array, keys: list[jax.Array], values: list[jax.Array]
                ) -> PagedKVCache:
    """pages with row slot `slot`'s keys and values set: per layer [F, H, K]."""
    put = lambda pool, new: pool.at[slot].set(new.astype(pool.dtype))  # noqa: E731
    return dataclasses.replace(pages, cross_keys=[put(p, k) for p, k in zip(pages.cross_keys, keys)],
                               cross_values=[put(p, v) for p, v in zip(pages.cross_values, values)])


def read_cross(cache: Any, layer: int) -> tuple[jax.Array, jax.Array]:
    """Layer `layer`'s keys and values [T, F, H, K] for each of the step's flat tokens (its row slot's).

    Only the engine's ragged steps hold them: a whole-sequence pass (prompt logprobs, `LLM.logits`) of an
    encoder-decoder model is refused before it is built."""
    if not isinstance(cache, RaggedPagedCache) or cache.pages.cross_keys is None:
        raise ValueError("cross-attention runs only in the engine's steps (its keys live per row slot)")
    slots = cache.token_slots
    return cache.pages.cross_keys[layer][slots], cache.pages.cross_values[layer][slots]
