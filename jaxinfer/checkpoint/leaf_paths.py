"""Dotted leaf paths of a weights tree ('embed', 'layers.3.wq', ...) and the tree back from them."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import jax

from jaxinfer.models import Weights
from jaxinfer.parallel.array_info import is_info


def leaf_paths(tree: Any, is_leaf: Callable[[Any], bool] = is_info) -> Iterator[tuple[str, Any]]:
    """(dotted path, leaf) pairs of a weights tree: 'embed', 'layers.3.wq', ... (is_leaf: what ends a path)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    for path, leaf in flat:
        yield ".".join(_key_name(k) for k in path), leaf


def _key_name(key: Any) -> str:
    for attr in ("name", "idx", "key"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def unflatten(abstract: Weights, arrays: dict[str, Any]) -> Weights:
    """The tree of `abstract`'s shape holding arrays[path] at each leaf path."""
    leaves, treedef = jax.tree.flatten(abstract, is_leaf=is_info)
    return jax.tree.unflatten(treedef, [arrays[p] for p, _ in leaf_paths(abstract)])
