"""A layer's weights with its place among the layers that run the same weights (looped and cycled decoders).

Dory's loops and HRM-Text's cycles run each checkpoint layer several times over, each run a decoder layer with its
own pages; what a run does at the edges of a pass (restart from a saved point, hand a stream back) depends on where
it sits, which its index cannot say inside a one-layer view (`layer_calls`: every layer is layer 0 there). The
family's `borrowed_leaves` hands each layer its weights wrapped with that place as static flags, so the runs alike
in place still share one trace.
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

    def at(self, flag: str) -> bool:
        """Whether the layer's place has `flag`."""
        return flag in self.place


def placed(weights: Any, **flags: bool) -> PlacedLayer:
    """`weights` with the flags that are true."""
    return PlacedLayer(weights, frozenset(name for name, on in flags.items() if on))
