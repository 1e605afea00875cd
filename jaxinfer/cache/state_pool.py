"""Per-request recurrent state of Mamba2 layers, kept beside the page pools and indexed by row slot.

A state layer keeps no K/V per token but one fixed-size state per request: the conv state (the last
conv_kernel - 1 inputs of its causal conv) and the SSM state (per head a [head_dim, state_size]
matrix), both float32. The engine keeps them per row slot (runtime/row_slots: a request holds its
slot while it runs, prefilling in chunks or waiting for budget), in `PagedKVCache.conv_states` /
`ssm_states`, so they are donated and updated in place by every step as the pages are.

A request's state starts from zeros at its position 0: a new request, and a preempted one that
recomputes (its old state is simply overwritten). Nothing else can start a request past position 0
(prefix caching is off for these models: a cached page holds K/V, not the state after it), so no
reset is shipped. The whole-sequence passes (`LLM.logits`, prompt logprobs, embeddings: a contiguous
cache) run each row from zeros and keep nothing.
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

CONV_AXES = (None, None, None)  # [S, K-1, C]: replicated (a small model's state; tp splitting comes later)
SSM_AXES = (None, None, None, None)  # [S, H, P, N]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerState:
    """One state layer's pools and where each of a step's flat tokens keeps its state."""

    conv: jax.Array  # [S, K-1, C] float32
    ssm: jax.Array | None  # [S, H, P, N] float32; None for a short conv (LFM2), which keeps a conv state alone
    token_slots: jax.Array  # [T] int32
    # static: the platform the step runs on ("cpu", "gpu", "tpu": the pools' own, else the default backend's),
    # which picks the recurrence's form (models/mamba2_mixer)
    platform: str = dataclasses.field(default="cpu", metadata=dict(static=True))


def with_states(pages: PagedKVCache, cfg: ModelConfig, slots: int, layout: Layout) -> PagedKVCache:
    """pages with zeroed state pools of `slots` row slots for cfg's state layers (unchanged without any)."""
    ss = cfg.state_space
    if ss is None:
        return pages
    conv_shape = (slots, ss.conv_kernel - 1, ss.conv_dim)
    ssm_shape = (slots, ss.num_heads, ss.head_dim, ss.state_size)
    state = [cfg.is_state_layer(i) for i in range(cfg.num_layers)]
    conv = [layout.zeros(conv_shape, jnp.float32, CONV_AXES) if s else None for s in state]
    ssm = [layout.zeros(ssm_shape, jnp.float32, SSM_AXES) if s and ss.has_ssm else None for s in state]
    return dataclasses.replace(pages, conv_states=conv, ssm_states=ssm)


def state_bytes(cfg: ModelConfig, slots: int) -> int:
    """Device bytes of the state pools of `slots` row slots (0 without state layers)."""
    ss = cfg.state_space
    return 0 if ss is None else slots * len(ss.layers) * ss.state_bytes()


def fresh_state(cfg: ModelConfig, rows: int, tokens: int) -> LayerState:
    """Zeroed pools of `rows` slots for a whole-sequence pass over [rows, tokens] (row r in slot r)."""
    ss = cfg.state_space
    return LayerState(
        conv=jnp.zeros((rows, ss.conv_kernel - 1, ss.conv_dim), jnp.float32),
        ssm=jnp.zeros((rows, ss.num_heads, ss.head_dim, ss.state_size), jnp.float32) if ss.has_ssm else None,
        token_slots=jnp.repeat(jnp.arange(rows, dtype=jnp.int32), tokens), platform=jax.default_backend(),
    )


def read_state(cache: Any, layer: int, cfg: ModelConfig, rows: int, tokens: int) -> LayerState:
    """Layer `layer`'s state as a step's [rows, tokens] sees it: the engine's pools through its ragged view,
    else (a whole-sequence pass) fresh zeros."""
    if isinstance(cache, RaggedPagedCache) and cache.pages.conv_states is not None:
        pages = cache.pages
        platform = pages.platform or jax.default_backend()
        return LayerState(pages.conv_states[layer], pages.ssm_states[layer], cache.token_slots, platform)
    return fresh_state(cfg, rows, tokens)


def write_state(cache: Any, layer: int, state: LayerState) -> Any:
    """cache with layer `layer`'s pools replaced (a whole-sequence pass keeps nothing: returned as it is)."""
    if not isinstance(cache, RaggedPagedCache) or cache.pages.conv_states is None:
        return cache
    conv, ssm = list(cache.pages.conv_states), list(cache.pages.ssm_states)
    conv[layer], ssm[layer] = state.conv, state.ssm
    pages = dataclasses.replace(cache.pages, conv_states=conv, ssm_states=ssm)
    return dataclasses.replace(cache, pages=pages)
