"""A checkpoint's own 4-bit levels (AWQ, GPTQ, compressed-tensors) as an int4 `QuantizedWeight`, exactly.

The loader reads a packed projection as three arrays in the weight's own layout (`checkpoint.packed_weights`
views): its levels 0..15, and each input's group's zero level and scale repeated along the inputs. Where
every group is a run of `group` inputs they fold back to one zero level and scale per group (GPTQ's act
order, whose `g_idx` scatters a group's inputs, is sorted by group first: the weight keeps that order,
`perm`): the stored nibbles are the levels, the scales keep their stored dtype (fp16 into bf16 would
round) and zero levels are kept unless all are the symmetric 8. Routed experts [E, K, N] fold the same
way, each expert on its own, into a `QuantizedExperts` (act order's experts are read dequantized). A
symmetric weight whose scales are bf16 values (llm-compressor's W4A16 of a bf16 model) lands on the
kernels' layout exactly.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from jaxinfer.quantization.quantized_experts import QuantizedExperts
from jaxinfer.quantization.quantized_weight import QuantizedWeight

SYMMETRIC_ZERO = 8


def _fold(codes: jax.Array, zeros: jax.Array, scales: jax.Array, k: int, group: int) -> tuple[jax.Array, ...]:
    """Packed values [K / 2, N], zero levels and scales [K / group, N], and whether each group's zeros and scales
    were one run, whether every zero level is the symmetric 8 and whether the scales are bf16 values."""
    pairs = codes.reshape(k // 2, 2, -1).astype(jnp.uint8)
    z3, s3 = zeros.reshape(k // group, group, -1), scales.reshape(k // group, group, -1)
    z, s = z3[:, 0], s3[:, 0]
    runs = jnp.all(z3 == z[:, None]) & jnp.all(s3 == s[:, None])
    bf16 = jnp.all(s.astype(jnp.bfloat16).astype(s.dtype) == s)
    return pairs[:, 0] | (pairs[:, 1] << 4), z.astype(jnp.uint8), s, runs, jnp.all(z == SYMMETRIC_ZERO), bf16


_fold_one = jax.jit(_fold, static_argnames=("k", "group"))


@functools.partial(jax.jit, static_argnames=("k", "group"))
def _fold_experts(codes: jax.Array, zeros: jax.Array, scales: jax.Array, k: int, group: int) -> tuple[jax.Array, ...]:
    """`_fold` of each expert [E, K, N]; the flags over all of them."""
    values, z, s, runs, symmetric, bf16 = jax.vmap(functools.partial(_fold, k=k, group=group))(codes, zeros, scales)
    return values, z, s, jnp.all(runs), jnp.all(symmetric), jnp.all(bf16)


def from_levels(codes: jax.Array, zeros: jax.Array, scales: jax.Array, contract: int, group: int,
                groups: jax.Array | None = None) -> QuantizedWeight | None:
    """The int4 weight whose product is (codes - zeros) * scales, each array of the weight's shape with its first
    `contract` axes the input; group: inputs a scale covers (0: all). Where the groups are not runs of inputs
    (GPTQ's act order) and `groups` gives each input's group (the weight's shape, repeated along the outputs),
    the inputs are stored sorted by group and the weight keeps that order (`perm`); None where they are not
    runs and no `groups` is given."""
    shape = tuple(codes.shape)
    k = math.prod(shape[:contract])
    group = group or k
    if k % group or group % 2:
        return None
    rows = [a.reshape(k, -1) for a in (codes, zeros, scales)]
    values, z, s, runs, symmetric, bf16 = _fold_one(*rows, k=k, group=group)
    perm = None
    if not bool(runs) and groups is not None:
        perm = jnp.argsort(groups.reshape(k, -1)[:, 0], stable=True).astype(jnp.int32)  # groups' inputs in order
        values, z, s, runs, symmetric, bf16 = _fold_one(*(a[perm] for a in rows), k=k, group=group)
    if not bool(runs):
        return None
    if bool(symmetric):
        return QuantizedWeight(values, s.astype(jnp.bfloat16) if bool(bf16) else s, shape, contract, "int4", group,
                               perm=perm)
    return QuantizedWeight(values, s, shape, contract, "int4", group, zeros=z, perm=perm)


def experts_from_levels(codes: jax.Array, zeros: jax.Array, scales: jax.Array, group: int) -> QuantizedExperts | None:
    """`from_levels` for routed experts [E, K, N] (each expert's input K): an int4 `QuantizedExperts`."""
    k = codes.shape[1]
    group = group or k
    if k % group or group % 2:
        return None
    values, z, s, runs, symmetric, bf16 = _fold_experts(codes, zeros, scales, k=k, group=group)
    if not bool(runs):
        return None
    if bool(symmetric):
        return QuantizedExperts(values, s.astype(jnp.bfloat16) if bool(bf16) else s, "int4", group)
    return QuantizedExperts(values, s, "int4", group, zeros=z)
