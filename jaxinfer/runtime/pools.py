"""The engine's page pools: how many pages fit, and the target's (and a draft model's or an EAGLE head's) pools.

The draft's pools have as many pages as the target's (same page ids, so the block manager's
allocation, prefix sharing and preemption hold for all). One device holds its share of a
page: the K/V pools are split by kv heads over tp; an EAGLE head's outputs are replicated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.cache import paged
from jaxinfer.cache.cross_pool import cross_bytes, with_cross
from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.cache.state_pool import state_bytes, with_states
from jaxinfer.config.engine import EngineConfig, device_pages
from jaxinfer.config.model import ModelConfig
from jaxinfer.runtime.assistant_rider import AssistantDraft
from jaxinfer.runtime.cache_spec import CacheSpec
from jaxinfer.runtime.eagle_rider import EagleDraft
from jaxinfer.runtime.engine_step import Rider
from jaxinfer.runtime.flat_forward import DraftModel
from jaxinfer.runtime.ngram_rider import NgramDraft, NgramLookup
from jaxinfer.speculative.eagle import EagleConfig
from jaxinfer.speculative.gemma4_assistant import AssistantConfig

# A draft model's shape, an EAGLE head's, a Gemma 4 assistant's, the device's prompt lookup, or none
DraftConfig = ModelConfig | EagleConfig | AssistantConfig | NgramLookup | None


def pool_size(
    config: EngineConfig, model_config: ModelConfig, draft_cfg: DraftConfig, dtype: jnp.dtype, cache_spec: CacheSpec,
    activation_bytes: Callable[[], int],
) -> int:
    """Pages in the pool (target and draft together), from the knobs and the device's memory.

    activation_bytes: the largest step's peak, profiled only where it is needed (an accelerator
    sizing its pool from memory).
    """
    kv_parts = cache_spec.mesh_layout.parts((model_config.num_kv_heads,), ("kv_heads",))
    page_bytes = paged.page_bytes(model_config, config.page_size, dtype, cache_spec.kv_dtype) // kv_parts
    if isinstance(draft_cfg, EagleConfig):  # its layer's K/V, its output and the target's features per position
        page_bytes += paged.page_bytes(draft_cfg.layer, config.page_size, dtype, cache_spec.kv_dtype)
        per_token = draft_cfg.layer.hidden_size + draft_cfg.feature_size
        page_bytes += config.page_size * per_token * jnp.dtype(eagle_pool_dtype(dtype)).itemsize
    elif isinstance(draft_cfg, AssistantConfig):  # the target's final hidden state per position (it reads its K/V)
        page_bytes += config.page_size * draft_cfg.backbone_hidden_size * jnp.dtype(eagle_pool_dtype(dtype)).itemsize
    elif isinstance(draft_cfg, NgramLookup):  # a token per position
        page_bytes += config.page_size * 4
    elif draft_cfg is not None:
        page_bytes += paged.page_bytes(draft_cfg, config.page_size, dtype, cache_spec.kv_dtype)
    if page_bytes == 0:  # no layer attends (Mamba2): pages are bookkeeping only, so every slot gets a whole table
        return config.resolve_num_pages(0, config.max_num_seqs * config.pages_per_seq + 1)
    stats = None if config.num_pages is not None else device_memory_stats()
    pages = None
    if stats is not None:
        states = state_bytes(model_config, config.max_num_seqs + 1)  # the state layers' pools sit beside the pages
        # and Whisper's cross pages
        states += cross_bytes(model_config, config.max_num_seqs + 1, config.page_size, jnp.dtype(dtype).itemsize)
        pages = device_pages(stats, config.memory_utilization, page_bytes, activation_bytes() + states)
        pages = least_over_processes(pages)
    return config.resolve_num_pages(page_bytes, pages)


def new_pools(
    model_config: ModelConfig, draft_cfg: DraftConfig, num_pages: int, page_size: int, dtype: jnp.dtype,
    cache_spec: CacheSpec, state_slots: int = 0,
) -> tuple[PagedKVCache, Rider]:
    """The target's page pool and, when speculating with a draft model, an EAGLE head, a Gemma 4 assistant or
    the device's prompt lookup, its pools. state_slots: row slots of a model with Mamba2 layers, whose states the
    target's pool holds beside its pages (cache/state_pool)."""

    def pool(cfg: ModelConfig) -> PagedKVCache:
        made = paged.init_page_pool(
            cfg, num_pages, page_size, dtype, cache_spec.kv_dtype,
            cache_spec.attention_backend, cache_spec.interpret, cache_spec.cpu_kernels, cache_spec.mesh_layout,
        )
        return dataclasses.replace(made, batch_invariant=cache_spec.batch_invariant)

    if isinstance(draft_cfg, EagleConfig):
        def per_position(width: int) -> jax.Array:
            shape = (num_pages, page_size, width)
            return cache_spec.mesh_layout.zeros(shape, eagle_pool_dtype(dtype), (None, None, None))

        predicted, features = per_position(draft_cfg.layer.hidden_size), per_position(draft_cfg.feature_size)
        draft = EagleDraft(pool(draft_cfg.layer), predicted, features, draft_cfg, jnp.dtype(dtype).name)
    elif isinstance(draft_cfg, AssistantConfig):
        features = cache_spec.mesh_layout.zeros((num_pages, page_size, draft_cfg.backbone_hidden_size),
                                                eagle_pool_dtype(dtype), (None, None, None))
        draft = AssistantDraft(features, draft_cfg, jnp.dtype(dtype).name)
    elif isinstance(draft_cfg, NgramLookup):
        draft = NgramDraft(cache_spec.mesh_layout.zeros((num_pages, page_size), jnp.int32, (None, None)), draft_cfg)
    else:
        draft = None if draft_cfg is None else DraftModel(pool(draft_cfg), draft_cfg, model_config.vocab_size)
    target = with_states(pool(model_config), model_config, state_slots, cache_spec.mesh_layout)
    return with_cross(target, model_config, state_slots, cache_spec.mesh_layout), draft


def eagle_pool_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """An EAGLE head's per-position pools: float32 on CPU (XLA:CPU copies a whole 16-bit buffer per
    scatter, updates a float32 one in place), the model's dtype elsewhere."""
    return jnp.float32 if jax.default_backend() == "cpu" else dtype


def device_memory_stats() -> dict[str, int] | None:
    """This process's first device's memory stats, or None where jax does not report them (CPU)."""
    stats = jax.local_devices()[0].memory_stats()
    return stats if stats and "bytes_limit" in stats else None


def least_over_processes(pages: int) -> int:
    """The smallest page count over processes, so every process sizes the same pool."""
    if jax.process_count() == 1:
        return pages
    from jax.experimental import multihost_utils

    return int(np.min(multihost_utils.process_allgather(np.int64(pages))))
