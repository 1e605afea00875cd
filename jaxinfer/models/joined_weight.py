"""Projections of the same activations stored side by side, so one matrix product computes them all.

q/k/v read the attention's normed input and gate/up the MLP's. Kept apart, each is its own
product: on a GPU its own kernel launch, and at decode its own matrix-vector product, which
reaches less of the memory bandwidth the smaller its matrix is (an H200 trace read q/k/v at
0.5-1.3 TB/s, gate and up at 1.5, the wider-input down projection at 2.8). Joined, one product
streams them all and the outputs are slices of its result. The CPU kernels' packed weights
already share one call (`layers.linears`), and on a mesh a joined matrix would not split by
heads, so joining is for one device's XLA and Triton paths (`models.join_projections`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Sequence

import jax
import jax.numpy as jnp

from jaxinfer.quantization.quantized_weight import QuantizedWeight


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class JoinedWeight:
    """Weights with one input (contract 1) as a single [K, sum of N] weight, plain or quantized.

    shapes: each part's own shape, in order; its output columns follow the previous part's.
    """

    weight: jax.Array | QuantizedWeight
    shapes: tuple[tuple[int, ...], ...] = dataclasses.field(metadata={"static": True})

    @property
    def widths(self) -> list[int]:
        return [math.prod(shape[1:]) for shape in self.shapes]


def joinable(ws: Sequence[object]) -> bool:
    """Whether the weights can be joined: plain arrays of one dtype, or quantized alike in the rows
    layout, each of contract 1 and one input size (packed or tiled CPU leaves are not)."""
    first = ws[0]
    if all(isinstance(w, jax.Array) for w in ws):
        return all(w.dtype == first.dtype and w.shape[0] == first.shape[0] for w in ws)
    if not all(isinstance(w, QuantizedWeight) for w in ws):
        return False
    same = _quantized_kind(first)
    return first.perm is None and all(
        not w.tiled and not w.gpu_kernel and w.contract == 1 and _quantized_kind(w) == same for w in ws)


def _quantized_kind(w: QuantizedWeight) -> tuple:
    """What quantized weights must share to be joined (a checkpoint's int4: its scales' dtype, zero levels or not;
    act order's input orders are not joined)."""
    return w.mode, w.group, w.in_size, w.scales.dtype, w.zeros is None, w.perm is None


def join(ws: Sequence[jax.Array | QuantizedWeight], release: bool = False) -> JoinedWeight:
    """The weights side by side (see `joinable`) in a new buffer.

    release: free the parts' buffers once the joined copy exists, so loading a model that fills
    most of a device does not need room for a second copy of its projections (the parts are
    unusable afterwards: only for trees nothing else holds).
    """
    shapes = tuple(tuple(w.shape) for w in ws)
    quantized = isinstance(ws[0], QuantizedWeight)
    buffers = [a for w in ws for a in (w.values, w.scales, w.zeros) if a is not None] if quantized else list(ws)
    if isinstance(ws[0], jax.Array):
        joined = _concatenate_columns([w.reshape(w.shape[0], -1) for w in ws])
    else:
        values, scales = _concatenate_columns([q.values for q in ws]), _concatenate_columns([q.scales for q in ws])
        first = ws[0]
        zeros = None if first.zeros is None else _concatenate_columns([q.zeros for q in ws])
        joined = QuantizedWeight(values, scales, (first.in_size, values.shape[-1]), 1, first.mode, first.group,
                                 zeros=zeros)
    if release:
        jax.block_until_ready(joined)
        for buffer in buffers:
            buffer.delete()
    return JoinedWeight(joined, shapes)


@jax.jit
def _concatenate_columns(parts: list[jax.Array]) -> jax.Array:
    return jnp.concatenate(parts, axis=-1)


def split(joined: JoinedWeight) -> list[jax.Array | QuantizedWeight]:
    """The parts back (copies), each in its own shape; quantized parts keep the joined one's marks."""
    w, parts, start = joined.weight, [], 0
    for shape, width in zip(joined.shapes, joined.widths):
        columns = slice(start, start + width)
        if isinstance(w, QuantizedWeight):
            zeros = None if w.zeros is None else w.zeros[..., columns]
            parts.append(dataclasses.replace(w, values=w.values[:, columns], scales=w.scales[..., columns],
                                             zeros=zeros, shape=shape))
        else:
            parts.append(w[:, columns].reshape(shape))
        start += width
    return parts


def split_outputs(y: jax.Array, joined: JoinedWeight) -> list[jax.Array]:
    """The joined product [M, sum of N] as each part's product [M, N_i]."""
    ends = itertools.accumulate(joined.widths)
    return [y[:, end - width : end] for end, width in zip(ends, joined.widths)]
