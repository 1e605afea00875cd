"""Batch-invariant products: a weight whose product with the activations runs a fixed number of
rows at a time, so a token's result does not depend on how many tokens share its step.

XLA picks a matrix product's algorithm, and with it the order of its float sums, by its shape:
on XLA:CPU a one-row product is a matrix-vector loop and more rows a blocked GEMM (at 576 x 1536
in float32 a row's outputs differ by up to 5e-5 between the two, and again from 64 rows on); GPU
libraries pick tilings and split-K by the row count too. So the same request's logits moved in
their last bits with the batch around it, the prompt's chunking and whether it was served from
the prefix cache, and a sampled token near a tie could flip. Here every product is a loop
(`lax.map`) over blocks of INVARIANT_ROWS rows: one shape, one algorithm, whatever the step.

The cost: a step of fewer rows computes a whole block (on a CPU a one-row decode step does 16
rows' arithmetic), and each block reads the weights again (a 64-row step reads them 4 times).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

INVARIANT_ROWS = 16


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class InvariantWeight:
    """A weight (an array, quantized, or an embedding used as the output head when `transposed`:
    [N, K], read as its transpose) whose products run INVARIANT_ROWS rows at a time."""

    weight: Any
    transposed: bool = dataclasses.field(default=False, metadata={"static": True})

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the weight as a product reads it ([K, N] for a transposed embedding)."""
        return tuple(self.weight.shape[::-1]) if self.transposed else tuple(self.weight.shape)

    @property
    def dtype(self) -> jnp.dtype:
        return self.weight.dtype


def in_row_blocks(product: Callable[[jax.Array], jax.Array], x2: jax.Array) -> jax.Array:
    """product(x2) for x2 [M, K], computed INVARIANT_ROWS rows at a time (padding rows are zeros)."""
    rows = x2.shape[0]
    blocks = -(-rows // INVARIANT_ROWS)
    padded = jnp.pad(x2, ((0, blocks * INVARIANT_ROWS - rows), (0, 0)))
    out = jax.lax.map(product, padded.reshape(blocks, INVARIANT_ROWS, x2.shape[1]))
    return out.reshape(blocks * INVARIANT_ROWS, -1)[:rows]
