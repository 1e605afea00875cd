"""Quantized weights in 32-column tiles for the CPU matmul kernel (see packed_matmul.cc).

int8: values [K, N] -> [ceil(N / 32), K, 32], scales [N] -> [32 * ceil(N / 32)].
int4: bytes [K / 2, N] (two rows per byte) -> [ceil(N / 32), K / 2, 32], scales [G, N] -> [G, 32 * ceil(N / 32)].
Each tile is one sequential stream, so decode reads a quantized weight at memory speed and
never materialises a dequantized copy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.cpu_kernels.build import load
from jaxinfer.cpu_kernels.packed_matmul import TILE

INT8_TARGET = "jaxinfer_int8_matmul"
INT4_TARGET = "jaxinfer_int4_matmul"


@jax.jit
def to_tiles(values: jax.Array) -> jax.Array:
    """[R, N] (R = K for int8, K / 2 for int4 bytes) -> [ceil(N / 32), R, 32], zero-padded columns."""
    rows, n = values.shape
    tiles = -(-n // TILE)
    padded = jnp.pad(values, ((0, 0), (0, tiles * TILE - n)))
    return padded.reshape(rows, tiles, TILE).transpose(1, 0, 2)


def from_tiles(tiled: jax.Array, n: int) -> jax.Array:
    """Inverse of `to_tiles`: [T, R, 32] -> [R, n]."""
    tiles, rows, _ = tiled.shape
    return tiled.transpose(1, 0, 2).reshape(rows, tiles * TILE)[:, :n]


def pad_columns(scales: jax.Array) -> jax.Array:
    """Scales [..., N] padded with ones to whole tiles [..., 32 * ceil(N / 32)]."""
    n = scales.shape[-1]
    pad = -(-n // TILE) * TILE - n
    return jnp.pad(scales, [(0, 0)] * (scales.ndim - 1) + [(0, pad)], constant_values=1)


def _require(source_symbol: str, target: str) -> None:
    if not load("packed_matmul.cc", source_symbol, target):
        raise RuntimeError("quantized tiles need the CPU kernel, which is unavailable here (see the log); use cpu_kernels=False")


def int8_tiles_matmul(x: jax.Array, tiles: jax.Array, scales: jax.Array, n: int) -> jax.Array:
    """x [M, K] @ (int8 tiles [T, K, 32] * scales [32T]) as float32 [M, n]."""
    _require("JaxinferInt8Matmul", INT8_TARGET)
    out = jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32)
    return jax.ffi.ffi_call(INT8_TARGET, out, vmap_method="sequential")(x.astype(jnp.float32), tiles, scales)


def int4_tiles_matmul(x: jax.Array, tiles: jax.Array, scales: jax.Array, n: int) -> jax.Array:
    """x [M, K] @ (int4 tiles [T, K / 2, 32] with bf16 group scales [G, 32T]) as float32 [M, n]."""
    _require("JaxinferInt4Matmul", INT4_TARGET)
    out = jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32)
    return jax.ffi.ffi_call(INT4_TARGET, out, vmap_method="sequential")(x.astype(jnp.float32), tiles, scales)
