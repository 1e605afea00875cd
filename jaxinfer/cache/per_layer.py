"""One-layer views of a cache whose buffers are lists with one entry per layer.

`models.layer_calls` runs each layer on such a view (as its layer 0), so that layers alike share
one trace; the view's buffers are then put back in place of the layer's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

Cache = TypeVar("Cache")


def layer_view(cache: Cache, fields: tuple[str, ...], layer: int) -> Cache:
    """`cache` whose per-layer lists in `fields` hold `layer`'s entry alone (None stays None)."""
    picked = {name: _pick(getattr(cache, name), layer) for name in fields}
    return dataclasses.replace(cache, **picked)


def with_layer(cache: Cache, fields: tuple[str, ...], layer: int, view: Cache) -> Cache:
    """`cache` with `layer`'s entries in `fields` replaced by the one-layer view's."""
    put = {name: _put(getattr(cache, name), layer, getattr(view, name)) for name in fields}
    return dataclasses.replace(cache, **put)


def _pick(entries: list[Any] | None, layer: int) -> list[Any] | None:
    return None if entries is None else [entries[layer]]


def _put(entries: list[Any] | None, layer: int, new: list[Any] | None) -> list[Any] | None:
    if entries is None:
        return None
    entries = list(entries)
    entries[layer] = new[0]
    return entries
