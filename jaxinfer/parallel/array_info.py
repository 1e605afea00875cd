"""Abstract weight leaves: shape and logical axes described once per model.

Loading, orbax restore and (later) sharding derive from the tree of `ArrayInfo`s a model
returns from its `abstract_weights(cfg)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """One weight leaf before it exists: its shape, logical axis names, init scale and any dtype of its own."""

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    init_std: float = 0.02
    init_value: float | None = None  # constant init (norm weights) instead of normal noise
    dtype: str | None = None  # kept in this dtype whatever the model's (GLM-4.5's router: float32); None: the model's

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.axes):
            raise ValueError(f"shape {self.shape} and axes {self.axes} differ in rank")

    def dtype_in(self, model_dtype: Any) -> jnp.dtype:
        """The leaf's dtype in a model of `model_dtype`."""
        return jnp.dtype(self.dtype or model_dtype)


def is_info(x: Any) -> bool:
    """True for ArrayInfo leaves (for jax.tree functions over abstract trees)."""
    return isinstance(x, ArrayInfo)


def tree_bytes(tree: Any) -> int:
    """Bytes held by the arrays of a pytree."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
