"""Quantized weights in 32-column tiles for the CPU matmul kernel (see packed_matmul.cc).

int8: values [K, N] -> [ceil(N / 32), ceil(K / 2), 64]: per pair of rows, each column's two
values side by side (the bf16 packing's order, zero-padded). Scales [N] -> [32 * ceil(N / 32)].
int4: bytes [K / 2, N] (row 2i in the low nibble, 2i + 1 in the high one) -> [ceil(N / 32), K / 4,
64]: per quad of rows 4q..4q + 3, each column's two bytes side by side, the first holding rows 4q
(low nibble) and 4q + 2 (high), the second 4q + 1 and 4q + 3. Scales [G, N] -> [ceil(N / 32), G,
32]: a tile's scales in one short run (from [G, N], a tile read 64 bytes from each of G rows).
The kernel multiplies a column's pair of rows by the activations' pair with one integer
multiply-add (vpmaddwd), hence the pairs. Each tile is one sequential stream, so decode reads
a quantized weight at memory speed and never materialises a dequantized copy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.kernels.cpu.build import load
from jaxinfer.kernels.cpu.packed_matmul import TILE, pair_tiles, pair_untiles

INT8_TARGET = "jaxinfer_int8_matmul"
INT4_TARGET = "jaxinfer_int4_matmul"


def _nibble_rows(values: jax.Array) -> jax.Array:
    """Bytes [K / 2, N] -> nibbles [K, N] (row 2i from the low nibble, 2i + 1 from the high one)."""
    return jnp.stack([values & 15, values >> 4], axis=1).reshape(-1, values.shape[1])


@jax.jit
def int4_tiles(values: jax.Array) -> jax.Array:
    """Bytes [K / 2, N] -> [ceil(N / 32), K / 4, 64], K a multiple of 4 (see the module docstring).

    The bytes are regrouped so byte row 2q + p holds rows 4q + p (low) and 4q + 2 + p (high),
    then tiled in pairs of byte rows like int8.
    """
    quads = _nibble_rows(values).reshape(-1, 2, 2, values.shape[1])  # [K / 4, high, odd, N]
    return pair_tiles((quads[:, 0] | (quads[:, 1] << 4)).reshape(values.shape))


def from_int4_tiles(tiled: jax.Array, k: int, n: int) -> jax.Array:
    """Inverse of `int4_tiles`: [T, K / 4, 64] -> bytes [K / 2, n] of a weight with K = k rows."""
    regrouped = pair_untiles(tiled, k // 2, n).reshape(-1, 2, n)  # [K / 4, odd, N]
    nibbles = jnp.stack([regrouped & 15, regrouped >> 4], axis=1).reshape(-1, 2, n)  # rows [K / 2, pair, N]
    return nibbles[:, 0] | (nibbles[:, 1] << 4)


def pad_columns(scales: jax.Array) -> jax.Array:
    """Scales [..., N] padded with ones to whole tiles [..., 32 * ceil(N / 32)]."""
    n = scales.shape[-1]
    pad = -(-n // TILE) * TILE - n
    return jnp.pad(scales, [(0, 0)] * (scales.ndim - 1) + [(0, pad)], constant_values=1)


def tile_group_scales(scales: jax.Array) -> jax.Array:
    """int4 scales [G, N] -> [ceil(N / 32), G, 32], padded with ones."""
    padded = pad_columns(scales)
    return padded.reshape(padded.shape[0], -1, TILE).transpose(1, 0, 2)


def untile_group_scales(tiled: jax.Array, n: int) -> jax.Array:
    """Inverse of `tile_group_scales`: [T, G, 32] -> [G, n]."""
    return tiled.transpose(1, 0, 2).reshape(tiled.shape[1], -1)[:, :n]


def _require(source_symbol: str, target: str) -> None:
    if not load("packed_matmul.cc", source_symbol, target):
        raise RuntimeError("quantized tiles need the CPU kernel, which is unavailable here (see the log); use cpu_kernels=False")


def int8_tiles_matmul(x: jax.Array, weights: list[tuple[jax.Array, jax.Array, int]]) -> list[jax.Array]:
    """x [M, K] @ (int8 tiles [T, ceil(K / 2), 64] * scales [32T]) as float32 [M, n], per (tiles, scales, n).

    All weights go in one kernel call. The kernel rounds each row of x to int16 with its own
    scale (error <= 2^-16 of the row's max).
    """
    _require("JaxinferInt8Matmul", INT8_TARGET)
    return _tiles_call(INT8_TARGET, x, weights)


def int4_tiles_matmul(x: jax.Array, weights: list[tuple[jax.Array, jax.Array, int]]) -> list[jax.Array]:
    """x [M, K] @ (int4 tiles [T, K / 4, 64] with bf16 group scales [T, G, 32]) as float32 [M, n], per weight.

    One group size for all; x is rounded to int16 per row, as for int8.
    """
    _require("JaxinferInt4Matmul", INT4_TARGET)
    return _tiles_call(INT4_TARGET, x, weights)


def _tiles_call(target: str, x: jax.Array, weights: list[tuple[jax.Array, jax.Array, int]]) -> list[jax.Array]:
    outs = [jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32) for _, _, n in weights]
    operands = [a for tiles, scales, _ in weights for a in (tiles, scales)]
    return jax.ffi.ffi_call(target, outs, vmap_method="sequential")(x.astype(jnp.float32), *operands)
