"""Which projections of a weights tree carry LoRA adapter slots, and how a slot's factors are laid out.

Every present projection of every layer gets slots (an adapter that leaves one untouched
writes zeros there). A joined projection (q/k/v or gate/up side by side, `joined_weight`)
gets one LoRAWeight over the joined matrix; its parts' factors sit side by side in a slot
(A [K, parts x rank], B block-diagonal [parts x rank, sum of N]), so the delta is still two
products and splits with the joined output.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxinfer.models.decoder import Weights
from jaxinfer.models.joined_weight import JoinedWeight
from jaxinfer.models.lora_weight import Zeros, with_slots
from jaxinfer.models.weight_ops import projections


class SlotTarget(NamedTuple):
    """One LoRAWeight of the tree: its layer, the projection fields it serves and their sizes."""

    layer: int
    fields: tuple[str, ...]  # one field, or a joined group's in order
    in_size: int  # K
    out_sizes: tuple[int, ...]  # each field's N


def with_adapter_slots(weights: Weights, slots: int, rank: int, zeros: Zeros = jnp.zeros) -> Weights:
    """weights with zeroed factors for `slots` adapters of rank up to `rank` on every present projection
    (made by `zeros`: replicated over a mesh, where each product's partitioner places them)."""
    dtype = (weights.embed if weights.final_norm is None else weights.final_norm).dtype  # OLMo 1 has no norm weight
    layers = []
    for lw in weights.layers:
        fields = {}
        for name, contract in projections(lw).items():
            w = getattr(lw, name)
            if isinstance(w, JoinedWeight):
                inner = with_slots(w.weight, 1, slots, rank * len(w.shapes), dtype, zeros)
                fields[name] = dataclasses.replace(w, weight=inner)
            else:
                fields[name] = with_slots(w, contract, slots, rank, dtype, zeros)
        layers.append(dataclasses.replace(lw, **fields))
    return dataclasses.replace(weights, layers=layers)


def slot_targets(weights: Weights) -> list[SlotTarget]:
    """The tree's LoRAWeights in tree order (`lora_weight.adapter_factors`' order): a layer's fields as its
    dataclass declares them, which need not be PROJECTIONS' order (Gemma 4's optional wk comes last)."""
    targets = []
    for i, lw in enumerate(weights.layers):
        present = projections(lw)
        for name, contract in ((f.name, present[f.name]) for f in dataclasses.fields(lw) if f.name in present):
            w = getattr(lw, name)
            if isinstance(w, JoinedWeight):
                joined = tuple(next(g for g in type(lw).JOINED if g[0] == name))
                targets.append(SlotTarget(i, joined, w.shapes[0][0], tuple(w.widths)))
            else:
                targets.append(SlotTarget(i, (name,), math.prod(w.shape[:contract]), (math.prod(w.shape[contract:]),)))
    return targets


def slot_factors(
    target: SlotTarget, factors: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]], rank: int, dtype: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """One slot's (a [K, parts x rank], b [parts x rank, sum of N]) for a target, from an adapter's
    factors per (layer, field): a [K, r], b [r, N] (scale folded in); fields it leaves alone are zeros."""
    parts = len(target.fields)
    a = np.zeros((target.in_size, parts * rank), np.float32)
    b = np.zeros((parts * rank, sum(target.out_sizes)), np.float32)
    column = 0
    for p, (name, width) in enumerate(zip(target.fields, target.out_sizes)):
        if (pair := factors.get((target.layer, name))) is not None:
            fa, fb = pair
            a[:, p * rank : p * rank + fa.shape[1]] = fa
            b[p * rank : p * rank + fb.shape[0], column : column + width] = fb
        column += width
    return a.astype(jnp.dtype(dtype)), b.astype(jnp.dtype(dtype))
