"""A layer's weights with what its index decides, for families whose layers differ by place, not by weights.

Inside a one-layer view (`layer_calls`) every layer is layer 0, so a layer cannot read its place from its index.
Dory's loops and HRM-Text's cycles run each checkpoint layer several times over, each run a decoder layer with its
own pages; what a run does at the edges of a pass (restart from a saved point, hand a stream back) depends on where
it sits: static flags, so the runs alike in place still share one trace. Beam scales each residual add by its
depth: per-layer constants handed as data (`scalars`), so every layer still shares one trace. The family's
`borrowed_leaves` hands each layer its weights wrapped this way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PlacedLayer:
    """A layer's weights and its place (the family's flag names, e.g. "restart"), static."""

    weights: Any
    place: frozenset[str] = dataclasses.field(default=frozenset(), metadata=dict(static=True))
    scalars: jax.Array | None = None  # [N] float32 constants of this layer's arithmetic (Beam's residual scales)

    def at(self, flag: str) -> bool:
        """Whether the layer's place has `flag`."""
        return flag in self.place


def placed(weights: Any, scalars: jax.Array | None = None, **flags: bool) -> PlacedLayer:
    """`weights` with the flags that are true (and the layer's constants)."""
    return PlacedLayer(weights, frozenset(name for name, on in flags.items() if on), scalars)
