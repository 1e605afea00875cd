"""Weight-only int8 / int4 matmul for decode on GPU with the Pallas Triton backend.

XLA lowers `quantization.quantized_matmul` on an H100 to a convert of the whole weight and a
dot (Llama-3.2-1B shape, batch 1: int8 0.85x and int4 0.71x the speed of bf16 although they
stream 0.61x and 0.43x of the bytes). Here each program streams a [block_k, block_n] strip of
the stored values, widens it to bf16 in registers (int8 and int4 values are exact in bf16) and
multiplies it by the activations on the tensor cores, so the weights are read once, as stored.

Grid: (column blocks, K splits). Decode has few rows and, per weight, too few column blocks to
fill the GPU, so K is split too; the splits' float32 partial products [splits, rows, N] (the
real rows only) are summed by XLA. int8 scales (one per column) are applied after that sum;
int4 scales (one per column and group of rows) inside, one group per loop step. Rows are padded to 16, the smallest
Triton dot. Runs on CPU with `interpret=True` (the tests). On the model path for leaves
`quantization.for_gpu_kernel` marks (`LLM(quantized_kernel=...)`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# `CompilerParams` since jax 0.6; older releases named it `TritonCompilerParams`.
_CompilerParams = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams")

ROWS = 16  # rows per program: Triton dots need M >= 16, so 1..16 decode rows share one block
DEFAULT_NUM_CORES = 132  # H100/H200 SM count; used when the device does not say


@dataclasses.dataclass(frozen=True)
class Tiling:
    """How one product is cut: columns per program, values per loop step, K splits, launch."""

    block_n: int = 128
    block_k: int = 128  # int8: rows per step; int4: the group decides (group / 2 byte rows)
    splits: int = 1
    num_warps: int = 4
    num_stages: int = 3


def _largest_dividing_power_of_2(n: int, cap: int) -> int:
    block = cap
    while block > 16 and n % block:
        block //= 2
    return block


def choose_tiling(
    k: int, n: int, step_rows: int, num_cores: int = DEFAULT_NUM_CORES, max_block_n: int = 128,
    programs_per_core: int = 2, max_splits: int | None = None,
) -> Tiling:
    """Blocks that divide the shape, and K splits (at most max_splits) until there are about
    programs_per_core programs per core.

    step_rows: weight rows one loop step reads (int8: block_k; int4: the group size).
    """
    block_n = _largest_dividing_power_of_2(n, max_block_n)
    steps = k // step_rows
    splits = 1
    while (n // block_n) * splits < programs_per_core * num_cores and steps % (2 * splits) == 0 and (
        max_splits is None or 2 * splits <= max_splits
    ):
        splits *= 2
    return Tiling(block_n=block_n, block_k=step_rows, splits=splits)


def choose_quantized_tiling(k: int, n: int, step_rows: int) -> Tiling:
    """int8/int4: many short programs (64 columns, up to 16 K splits, up to 8 programs a core).
    On an H200, Llama-3.2-1B shape, batch-1 decode went from 1.12x to 1.17x of bf16 with int4
    and 1.20x to 1.21x with int8 (one run each) against 128 columns at two programs a core; the
    tiling sweep of scripts/bench_quant_matmul.py also favoured 16 splits."""
    return choose_tiling(k, n, step_rows, max_block_n=64, programs_per_core=8, max_splits=16)


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """bf16 x bf16 on the tensor cores, summed in float32."""
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _store_rows(o_ref, acc: jax.Array, rows: int) -> None:
    """o = acc's first `rows` rows (the real ones; the rest are padding): a split's partial
    products are summed over [splits, rows, N], so padding rows need not reach memory (at 16
    splits of a 2048-wide input they would write half as many bytes as the int8 weight)."""
    if rows == ROWS:
        o_ref[...] = acc
    else:
        plgpu.store(o_ref, acc, mask=lax.broadcasted_iota(jnp.int32, acc.shape, 0) < rows)


def _strip_kernel(x_ref, w_ref, o_ref, *, steps: int, block_k: int, rows: int):
    """o [ROWS, block_n] = x [ROWS, K] . w[split's rows, block_n], float32 (int8 or bf16 w)."""
    first = pl.program_id(1) * steps * block_k

    def step(i, acc):
        ks = pl.ds(pl.multiple_of(first + i * block_k, block_k), block_k)
        w = w_ref[ks, :].astype(jnp.bfloat16)
        return acc + _dot(x_ref[:, ks], w)

    acc = lax.fori_loop(0, steps, step, jnp.zeros((ROWS, o_ref.shape[-1]), jnp.float32))
    _store_rows(o_ref, acc, rows)


def _int4_kernel(even_ref, odd_ref, w_ref, s_ref, o_ref, *, steps: int, half_group: int, rows: int):
    """The same from int4 bytes [K / 2, block_n] (low nibble row 2i, high 2i + 1, each + 8),
    one bf16 scale row per group; even/odd hold x's even and odd columns [ROWS, K / 2]."""
    first_group = pl.program_id(1) * steps

    def step(i, acc):
        g = first_group + i
        ks = pl.ds(pl.multiple_of(g * half_group, half_group), half_group)
        b = w_ref[ks, :].astype(jnp.int32)
        low = ((b & 15) - 8).astype(jnp.bfloat16)
        high = ((b >> 4) - 8).astype(jnp.bfloat16)
        part = _dot(even_ref[:, ks], low) + _dot(odd_ref[:, ks], high)
        return acc + part * s_ref[pl.ds(g, 1), :].astype(jnp.float32)

    acc = lax.fori_loop(0, steps, step, jnp.zeros((ROWS, o_ref.shape[-1]), jnp.float32))
    _store_rows(o_ref, acc, rows)


def _padded_rows(x: jax.Array) -> jax.Array:
    if x.shape[0] > ROWS:
        raise ValueError(f"the GPU quantized matmul takes up to {ROWS} rows (decode), got {x.shape[0]}")
    return jnp.pad(x.astype(jnp.bfloat16), ((0, ROWS - x.shape[0]), (0, 0)))


def _call(kernel, operands, specs, n: int, rows: int, t: Tiling, interpret: bool, name: str) -> jax.Array:
    """The pallas_call over (column blocks, splits): the real rows' partial products summed over the splits."""
    partial = pl.pallas_call(
        kernel,
        grid=(n // t.block_n, t.splits),
        in_specs=specs,
        out_specs=pl.BlockSpec((None, ROWS, t.block_n), lambda j, s: (s, 0, j)),
        out_shape=jax.ShapeDtypeStruct((t.splits, ROWS, n), jnp.float32),
        compiler_params=_CompilerParams(num_warps=t.num_warps, num_stages=t.num_stages),
        interpret=interpret,
        name=name,
    )(*operands)
    return partial[:, :rows].sum(axis=0)


@functools.partial(jax.jit, static_argnames=("tiling", "interpret"))
def int8_matmul_gpu(
    x: jax.Array, values: jax.Array, scales: jax.Array, tiling: Tiling | None = None, interpret: bool = False
) -> jax.Array:
    """x [M <= 16, K] (rounded to bf16) @ (values int8 [K, N] * scales f32 [N]) as float32 [M, N]."""
    k, n = values.shape
    t = tiling or choose_quantized_tiling(k, n, 128 if k % 128 == 0 else _largest_dividing_power_of_2(k, 64))
    return _strip_matmul(x, values, t, interpret, "int8_matmul_gpu") * scales[None, :]


def _strip_matmul(x: jax.Array, w: jax.Array, t: Tiling, interpret: bool, name: str) -> jax.Array:
    """x [M <= 16, K] @ w [K, N] (int8 or bf16) as float32 [M, N] through `_strip_kernel`."""
    k, n = w.shape
    steps = k // (t.splits * t.block_k)
    if steps * t.splits * t.block_k != k or n % t.block_n:
        raise ValueError(f"tiling {t} does not divide the weight [{k}, {n}]")
    specs = [pl.BlockSpec((ROWS, k), lambda j, s: (0, 0)), pl.BlockSpec((k, t.block_n), lambda j, s: (0, j))]
    kernel = functools.partial(_strip_kernel, steps=steps, block_k=t.block_k, rows=x.shape[0])
    return _call(kernel, (_padded_rows(x), w), specs, n, x.shape[0], t, interpret, name)


@functools.partial(jax.jit, static_argnames=("tiling", "interpret"))
def bf16_matmul_gpu(x: jax.Array, w: jax.Array, tiling: Tiling | None = None, interpret: bool = False) -> jax.Array:
    """x [M <= 16, K] (rounded to bf16) @ w bf16 [K, N] as float32 [M, N]: the decode product
    streamed by column strips with K split, as the int8 one (XLA's Triton gemms streamed
    Llama-3.2-1B's projections at 1.5-2.8 TB/s of an H200's ~3.7 at batch 1)."""
    k, n = w.shape
    t = tiling or choose_tiling(k, n, 64 if k % 64 == 0 else _largest_dividing_power_of_2(k, 32))
    return _strip_matmul(x, w, t, interpret, "bf16_matmul_gpu")


@functools.partial(jax.jit, static_argnames=("group", "tiling", "interpret"))
def int4_matmul_gpu(
    x: jax.Array, values: jax.Array, scales: jax.Array, group: int, tiling: Tiling | None = None,
    interpret: bool = False,
) -> jax.Array:
    """x [M <= 16, K] @ int4 bytes [K / 2, N] with bf16 scales [K / group, N] as float32 [M, N]."""
    half_k, n = values.shape
    t = tiling or choose_quantized_tiling(2 * half_k, n, group)
    steps = scales.shape[0] // t.splits
    if steps * t.splits != scales.shape[0] or scales.shape[0] * group != 2 * half_k or n % t.block_n:
        raise ValueError(f"tiling {t} with group {group} does not divide the weight [{2 * half_k}, {n}]")
    rows, x = x.shape[0], _padded_rows(x)
    specs = [
        pl.BlockSpec((ROWS, half_k), lambda j, s: (0, 0)),
        pl.BlockSpec((ROWS, half_k), lambda j, s: (0, 0)),
        pl.BlockSpec((half_k, t.block_n), lambda j, s: (0, j)),
        pl.BlockSpec((scales.shape[0], t.block_n), lambda j, s: (0, j)),
    ]
    kernel = functools.partial(_int4_kernel, steps=steps, half_group=group // 2, rows=rows)
    return _call(kernel, (x[:, 0::2], x[:, 1::2], values, scales), specs, n, rows, t, interpret, "int4_matmul_gpu")
