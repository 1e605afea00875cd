"""Whole pages copied out of a paged KV cache's pools to the host, and written back into them.

Every per-layer buffer of a pool holds pages on axis 1 ([KV, P, page_size, K] values, [KV, P,
page_size] scales of int8/fp8 pools), so one gather or scatter over that axis serves K, V and
their scales alike. Page lists are padded to a power of two, so a handful of small programs serve
every count. Saved sessions (`checkpoint/kv_session`) are made of these copies, and the prefix
cache's host tier (runtime/kv_offload) runs `take` and `put` as programs of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.cache.paged import LAYERED, POOL_AXES, SCALE_AXES, PagedKVCache
from jaxinfer.config.buckets import bucket
from jaxinfer.config.model import ConfigError
from jaxinfer.parallel.sharding import Layout

Buffers = dict[str, list[jax.Array]]  # LAYERED name -> one buffer per layer


def page_buffers(cache: PagedKVCache) -> Buffers:
    """The cache's per-layer buffers by field name (scales only where the pools are quantized)."""
    return {name: getattr(cache, name) for name in LAYERED if getattr(cache, name) is not None}


def buffer_specs(cache: PagedKVCache) -> dict[str, tuple[tuple[int, ...], str]]:
    """Per field, the shape of its layers stacked with the page axis left out ([L, KV, page_size, ...])
    and the stored dtype: what pages copied from one cache need to fit another."""
    specs = {}
    for name, layers in page_buffers(cache).items():
        shape = layers[0].shape
        if any(layer.shape != shape for layer in layers):  # Gemma 4's layers of their own K/V shapes
            raise ConfigError(f"page copies (kv_offloading_size, saved sessions) stack every layer's pages, but this "
                              f"model's {name} layers differ in shape ({sorted({x.shape for x in layers})}); "
                              "run it without them")
        specs[name] = ((len(layers), shape[0], *shape[2:]), jnp.dtype(layers[0].dtype).name)
    return specs


def read_pages(cache: PagedKVCache, pages: Sequence[int]) -> dict[str, np.ndarray]:
    """Host copies of `pages`, per field stacked over layers: [L, KV, len(pages), page_size, ...]."""
    return stacked_on_host(_take(page_buffers(cache), jnp.asarray(padded_reads(pages))), len(pages))


def padded_reads(pages: Sequence[int]) -> np.ndarray:
    """Page ids padded to a power of two with page 0 (a real page: reading it is harmless)."""
    padded = np.zeros(bucket(len(pages)), np.int32)
    padded[: len(pages)] = pages
    return padded


def stacked_on_host(taken: Buffers, count: int) -> dict[str, np.ndarray]:
    """`take`'s buffers as NumPy (waits for them), the padding cut: [L, KV, count, page_size, ...] per field."""
    return {name: np.stack([np.asarray(layer)[:, :count] for layer in layers]) for name, layers in taken.items()}


def write_pages(cache: PagedKVCache, pages: Sequence[int], values: dict[str, np.ndarray]) -> PagedKVCache:
    """The cache with `pages` holding `values` (as `read_pages` returns them); its buffers are donated."""
    targets, fill = padded_writes(cache, pages, values)
    written = _put(page_buffers(cache), jnp.asarray(targets), fill, cache.layout)
    return dataclasses.replace(cache, **written)


def padded_writes(
    cache: PagedKVCache, pages: Sequence[int], values: dict[str, np.ndarray]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """`put`'s page ids and values padded to a power of two: the padding targets a page past the pool,
    whose writes are dropped."""
    count, padded_count = len(pages), bucket(len(pages))
    padded = np.full(padded_count, cache.k_pages[0].shape[1], np.int32)
    padded[:count] = pages
    widths = [(0, 0)] * 2 + [(0, padded_count - count)]
    return padded, {name: np.pad(stacked, widths + [(0, 0)] * (stacked.ndim - 3)) for name, stacked in values.items()}


def take(buffers: Buffers, pages: jax.Array) -> Buffers:
    """Every buffer's pages `pages` (axis 1)."""
    return jax.tree.map(lambda buffer: jnp.take(buffer, pages, axis=1), buffers)


def put(buffers: Buffers, pages: jax.Array, values: dict[str, jax.Array], layout: Layout) -> Buffers:
    """The buffers with pages `pages` set to values[name][layer] (out-of-range pages dropped), in their layout."""
    written = {}
    for name, layers in buffers.items():
        axes = POOL_AXES if layers[0].ndim == len(POOL_AXES) else SCALE_AXES
        written[name] = [
            layout.constrain(layer.at[:, pages].set(values[name][i].astype(layer.dtype), mode="drop"), axes)
            for i, layer in enumerate(layers)
        ]
    return written


_take = jax.jit(take)
_put = jax.jit(put, static_argnums=3, donate_argnums=0)
