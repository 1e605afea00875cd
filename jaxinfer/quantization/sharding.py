"""Quantized leaves placed on a mesh by the logical axes of the weights they replace."""

from __future__ import annotations

from typing import Any

import jax

from jaxinfer.parallel.array_info import ArrayInfo, is_info
from jaxinfer.parallel.sharding import Layout
from jaxinfer.quantization.quantized_experts import QuantizedExperts, shard_experts
from jaxinfer.quantization.quantized_weight import QuantizedWeight, shard_quantized


def shard_quantized_tree(weights: Any, abstract: Any, layout: Layout) -> Any:
    """Every quantized leaf of weights (projections, experts) sharded by the ArrayInfo at its place in
    abstract; other leaves as they are."""

    def place(info: ArrayInfo, leaf: Any) -> Any:
        if isinstance(leaf, QuantizedWeight):
            return shard_quantized(leaf, info.axes, layout)
        if isinstance(leaf, QuantizedExperts):
            return shard_experts(leaf, info.axes, layout)
        return leaf

    return jax.tree.map(place, abstract, weights, is_leaf=is_info)
