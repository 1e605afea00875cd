"""Whole pages copied out of a paged KV cache's pools to the host, and written back into them.

Every per-layer buffer of a pool holds pages on axis 1 ([KV, P, page_size, K] values, [KV, P,
page_size] scales of int8/fp8 pools), so one gather or scatter over that axis serves K, V and
their scales alike. Page lists are padded to a power of two, so a handful of small programs serve
every count. Saved sessions (`checkpoint/kv_session`) are made of these copies.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.cache.paged import LAYERED, POOL_AXES, SCALE_AXES, PagedKVCache
from jaxinfer.config.buckets import bucket
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
        specs[name] = ((len(layers), shape[0], *shape[2:]), jnp.dtype(layers[0].dtype).name)
    return specs


def read_pages(cache: PagedKVCache, pages: Sequence[int]) -> dict[str, np.ndarray]:
    """Host copies of `pages`, per field stacked over layers: [L, KV, len(pages), page_size, ...]."""
    padded = np.zeros(bucket(len(pages)), np.int32)  # page 0 is a real page: reading it is harmless
    padded[: len(pages)] = pages
    taken = _take(page_buffers(cache), jnp.asarray(padded))
    return {name: np.stack([np.asarray(layer)[:, : len(pages)] for layer in layers]) for name, layers in taken.items()}


def write_pages(cache: PagedKVCache, pages: Sequence[int], values: dict[str, np.ndarray]) -> PagedKVCache:
    """The cache with `pages` holding `values` (as `read_pages` returns them); its buffers are donated."""
    count, padded_count = len(pages), bucket(len(pages))
    num_pages = cache.k_pages[0].shape[1]
    padded = np.full(padded_count, num_pages, np.int32)  # past the pool: those writes are dropped
    padded[:count] = pages
    widths = [(0, 0)] * 2 + [(0, padded_count - count)]
    fill = {name: np.pad(stacked, widths + [(0, 0)] * (stacked.ndim - 3)) for name, stacked in values.items()}
    written = _put(page_buffers(cache), jnp.asarray(padded), fill, cache.layout)
    return dataclasses.replace(cache, **written)


@jax.jit
def _take(buffers: Buffers, pages: jax.Array) -> Buffers:
    return jax.tree.map(lambda buffer: jnp.take(buffer, pages, axis=1), buffers)


@functools.partial(jax.jit, static_argnums=3, donate_argnums=0)
def _put(buffers: Buffers, pages: jax.Array, values: dict[str, jax.Array], layout: Layout) -> Buffers:
    written = {}
    for name, layers in buffers.items():
        axes = POOL_AXES if layers[0].ndim == len(POOL_AXES) else SCALE_AXES
        written[name] = [
            layout.constrain(layer.at[:, pages].set(values[name][i].astype(layer.dtype), mode="drop"), axes)
            for i, layer in enumerate(layers)
        ]
    return written
