"""Matmul with bf16 weights packed into 32-column tiles, on CPU (see packed_matmul.cc)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxinfer.kernels.cpu.build import load

TARGET = "jaxinfer_packed_matmul"
TILE = 32  # output columns per tile


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedWeight:
    """A bf16 weight of `shape` in the kernel's tile layout; the first `contract` axes are its input.

    data is [ceil(N / 32), ceil(K / 2), 64] for K = prod(shape[:contract]), N the rest: per tile of
    32 output columns, each pair of input rows interleaved column by column.
    """

    data: jax.Array
    shape: tuple[int, ...] = dataclasses.field(metadata={"static": True})
    contract: int = dataclasses.field(metadata={"static": True})

    @property
    def in_size(self) -> int:
        return math.prod(self.shape[: self.contract])

    @property
    def out_size(self) -> int:
        return math.prod(self.shape[self.contract :])


def packing_applies(dtype: jnp.dtype) -> bool:
    """Whether weights of `dtype` are packed when the CPU kernels are on (bf16 only)."""
    return jnp.dtype(dtype) == jnp.bfloat16


def pack_weight(w: jax.Array, contract: int = 1) -> PackedWeight:
    """w (bf16, first `contract` axes its input) in the kernel's tile layout."""
    k, n = math.prod(w.shape[:contract]), math.prod(w.shape[contract:])
    return PackedWeight(pair_tiles(w.reshape(k, n)), tuple(w.shape), contract)


@jax.jit
def pair_tiles(w2: jax.Array) -> jax.Array:
    """[K, N] (any dtype) -> [ceil(N / 32), ceil(K / 2), 64]: per tile of 32 columns and pair of rows,
    each column's two values side by side; zero-padded. The bf16 and int8 kernels' layout."""
    k, n = w2.shape
    k2, tiles = -(-k // 2), -(-n // TILE)
    padded = jnp.pad(w2, ((0, 2 * k2 - k), (0, tiles * TILE - n)))
    return padded.reshape(k2, 2, tiles, TILE).transpose(2, 0, 3, 1).reshape(tiles, k2, 2 * TILE)


def pair_untiles(data: jax.Array, k: int, n: int) -> jax.Array:
    """Inverse of `pair_tiles`: [T, K2, 64] -> [k, n]."""
    tiles, k2, _ = data.shape
    return data.reshape(tiles, k2, TILE, 2).transpose(1, 3, 0, 2).reshape(2 * k2, tiles * TILE)[:k, :n]


def unpack_weight(p: PackedWeight) -> jax.Array:
    """The weight back in its original layout."""
    return pair_untiles(p.data, p.in_size, p.out_size).reshape(p.shape)


def packed_matmul(x: jax.Array, p: PackedWeight) -> jax.Array:
    """x [M, K] (rounded to bf16) @ the packed weight as float32 [M, N], for any M.

    From one row (decode) to thousands (prefill) this is at least as fast as XLA's dot on the
    unpacked weight on CPU; at 1 to 8 rows it reads the weights about twice as fast.
    """
    return packed_matmuls(x, [p])[0]


def packed_matmuls(x: jax.Array, ps: list[PackedWeight]) -> list[jax.Array]:
    """x [M, K] @ each packed weight (same K) in one kernel call: one thread-pool dispatch for all."""
    if not load("packed_matmul.cc", "JaxinferPackedMatmul", TARGET):
        raise RuntimeError("packed weights need the CPU kernel, which is unavailable here (see the log); use cpu_kernels=False")
    pad = 2 * ps[0].data.shape[1] - x.shape[1]
    x = jnp.pad(x.astype(jnp.bfloat16), ((0, 0), (0, pad)))
    outs = [jax.ShapeDtypeStruct((x.shape[0], p.out_size), jnp.float32) for p in ps]
    return jax.ffi.ffi_call(TARGET, outs, vmap_method="sequential")(x, *(p.data for p in ps))
