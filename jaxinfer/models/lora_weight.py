"""LoRA adapters served beside the base weights: each projection carries every adapter slot's
low-rank factors, and each token of a step picks its row's slot.

A LoRA adapter changes a projection W to W + B A (scaled). Merging it into W would serve one
adapter per model; kept apart, one step serves rows of several adapters and rows of none
(vLLM's multi-LoRA, punica's batched products). Here the slots' factors are stored side by
side, A as [K, slots x width] and B as [slots x width, N], so a step's delta is two dense
products whatever the mix: x A for every slot's columns, the columns of other slots than the
token's zeroed, then times B. With width = the largest rank (16) and a few slots, that is a few
percent of a projection's arithmetic and memory, on every platform, with no gather and no new
kernel; a step of base-model rows only computes zeros. The factors are data: loading an adapter
into a slot writes arrays and compiles nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.kernels.precision import matmul_precision

NO_ADAPTER = -1  # a row served by the base model


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoRAWeight:
    """A projection (any weight leaf `_matmul` reads as [K, N]) with its adapter slots' factors.

    a: [K, slots * width] each slot's A (transposed: input first), zero past the adapter's rank.
    b: [slots * width, N] each slot's B (transposed, the adapter's scale folded in).
    token_slots: [M] int32 each product row's slot (NO_ADAPTER: none), set per step by
    `bind_token_slots`; None outside a step (the base weight alone).
    """

    base: Any
    a: jax.Array
    b: jax.Array
    token_slots: jax.Array | None = None
    width: int = dataclasses.field(default=1, metadata={"static": True})
    # Skip the products when no token of the step has an adapter (a conditional: not on GPUs,
    # where XLA reads its predicate back on the host; there they always run).
    skip_idle: bool = dataclasses.field(default=False, metadata={"static": True})

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.base.shape)

    @property
    def dtype(self) -> jnp.dtype:
        return self.base.dtype

    @property
    def slots(self) -> int:
        return self.a.shape[-1] // self.width


def adapter_delta(x2: jax.Array, w: LoRAWeight) -> jax.Array:
    """x2 [M, K] through each row's adapter (B A x) as float32 [M, N]; zeros for rows of no adapter."""

    def delta() -> jax.Array:
        xa = jnp.dot(x2, w.a, precision=matmul_precision(x2, w.a), preferred_element_type=jnp.float32)
        column_slot = jnp.arange(w.a.shape[-1], dtype=jnp.int32) // w.width
        xa = jnp.where(w.token_slots[:, None] == column_slot[None, :], xa, 0.0).astype(x2.dtype)
        return jnp.dot(xa, w.b, precision=matmul_precision(xa, w.b), preferred_element_type=jnp.float32)

    if not w.skip_idle:
        return delta()
    none = lambda: jnp.zeros((x2.shape[0], w.b.shape[-1]), jnp.float32)  # noqa: E731
    return jax.lax.cond(jnp.any(w.token_slots != NO_ADAPTER), delta, none)


Zeros = Callable[[tuple[int, ...], Any], jax.Array]  # (shape, dtype) -> a zeroed array where it is to live


def with_slots(w: Any, contract: int, slots: int, width: int, dtype: jnp.dtype, zeros: Zeros = jnp.zeros) -> LoRAWeight:
    """w (its first `contract` axes the input) with zeroed factors for `slots` adapters of rank up to `width`."""
    k, n = math.prod(w.shape[:contract]), math.prod(w.shape[contract:])
    return LoRAWeight(w, zeros((k, slots * width), dtype), zeros((slots * width, n), dtype), None, width)


def is_lora(node: Any) -> bool:
    return isinstance(node, LoRAWeight)


def bind_token_slots(tree: Any, token_slots: jax.Array, branchless: bool) -> Any:
    """tree with every LoRAWeight reading token_slots [M] (trees without adapters as they are);
    not branchless, a step whose tokens have no adapter skips the adapters' products."""
    bound = lambda n: dataclasses.replace(n, token_slots=token_slots, skip_idle=not branchless)  # noqa: E731
    return jax.tree.map(lambda n: bound(n) if is_lora(n) else n, tree, is_leaf=is_lora)


def has_adapters(tree: Any) -> bool:
    """Whether the tree holds adapter slots."""
    return any(is_lora(n) for n in jax.tree.leaves(tree, is_leaf=is_lora))


def adapter_factors(tree: Any) -> list[jax.Array]:
    """Every LoRAWeight's (a, b) in tree order, flat: what loading an adapter rewrites."""
    return [f for n in jax.tree.leaves(tree, is_leaf=is_lora) if is_lora(n) for f in (n.a, n.b)]


def with_factors(tree: Any, factors: list[jax.Array]) -> Any:
    """tree with its LoRAWeights' factors replaced, in `adapter_factors` order."""
    left = iter(factors)
    return jax.tree.map(lambda n: dataclasses.replace(n, a=next(left), b=next(left)) if is_lora(n) else n, tree,
                        is_leaf=is_lora)


@functools.partial(jax.jit, donate_argnums=0)
def write_slot(factors: list[jax.Array], slot: jax.Array, values: list[jax.Array]) -> list[jax.Array]:
    """`adapter_factors` with slot `slot` (data: one program for every slot) set to values, a
    [K, width] and b [width, N] per LoRAWeight in turn."""
    written = []
    for i, (factor, value) in enumerate(zip(factors, values)):
        start = (0, slot * value.shape[1]) if i % 2 == 0 else (slot * value.shape[0], 0)
        written.append(jax.lax.dynamic_update_slice(factor, value.astype(factor.dtype), start))
    return written
