"""Abstract weight leaves: shape, dtype and logical axes described once per model.

Initialisation, loading and (later) sharding all derive from the tree of `ArrayInfo`s a model
returns from its `abstract_weights(cfg)`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """One weight leaf before it exists: its shape, logical axis names and init scale."""

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    init_std: float = 0.02
    init_value: float | None = None  # constant init (norm weights) instead of normal noise

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.axes):
            raise ValueError(f"shape {self.shape} and axes {self.axes} differ in rank")


def is_info(x: Any) -> bool:
    """True for ArrayInfo leaves (for jax.tree functions over abstract trees)."""
    return isinstance(x, ArrayInfo)


def init_weights(abstract: Any, key: jax.Array, dtype: jnp.dtype) -> Any:
    """Random weights for an abstract tree (tests and benchmarks; real runs load checkpoints)."""
    leaves, treedef = jax.tree.flatten(abstract, is_leaf=is_info)
    keys = jax.random.split(key, len(leaves))
    arrays = [_init_leaf(info, k, dtype) for info, k in zip(leaves, keys)]
    return jax.tree.unflatten(treedef, arrays)


def _init_leaf(info: ArrayInfo, key: jax.Array, dtype: jnp.dtype) -> jax.Array:
    if info.init_value is not None:
        return jnp.full(info.shape, info.init_value, dtype)
    return (info.init_std * jax.random.normal(key, info.shape, jnp.float32)).astype(dtype)


def count_parameters(abstract: Any) -> int:
    """Total number of scalars in an abstract tree."""
    return sum(math.prod(i.shape) for i in jax.tree.leaves(abstract, is_leaf=is_info))


def tree_bytes(tree: Any) -> int:
    """Bytes held by the arrays of a pytree."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
