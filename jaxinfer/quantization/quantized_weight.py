"""Weight-only quantization: a `QuantizedWeight` leaf (values + scales) read by `quantized_matmul`.

Modes: "int8" (one float32 scale per output column), "int4" (symmetric, one bf16 scale per
output column and group of `group` input rows, two values per byte: row 2i in the low nibble,
2i + 1 in the high one, each stored + 8) and "fp8" (e4m3 values, one float32 scale per column).
A weight of `shape` whose first `contract` axes are its input is stored as a matrix [K, N].
An int4 weight read from an AWQ, GPTQ or compressed-tensors checkpoint (`stored_int4`) keeps
that checkpoint's levels: its scales as stored (float16 too), where asymmetric a zero level per
group (`zeros`; None is the symmetric 8), and for GPTQ's act order the input order its groups run in
(`perm`, gathered from the activations); only the XLA path reads those, the kernels take the
symmetric layout with bf16 scales (`native_int4`).
The model code is unchanged: `layers.linear` dispatches on the leaf type. On a mesh the values
and scales take shardings derived from the logical axes of the weight they replace (`quantized_specs`).
A leaf marked `gpu_kernel` (`for_gpu_kernel`) runs bf16 decode rows through the Pallas Triton
kernel of `pallas_kernels/quant_matmul_gpu.py`, which reads the stored values in place.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from jaxinfer.kernels.cpu.packed_matmul import pair_tiles, pair_untiles
from jaxinfer.kernels.cpu.packed_quant import (
    from_int4_tiles,
    int4_tiles,
    int4_tiles_matmul,
    int8_tiles_matmul,
    pad_columns,
    tile_group_scales,
    untile_group_scales,
)
from jaxinfer.kernels.precision import matmul_precision
from jaxinfer.parallel.sharding import Layout
from pallas_kernels.quant_matmul_gpu import ROWS as KERNEL_ROWS
from pallas_kernels.quant_matmul_gpu import int4_matmul_gpu, int8_matmul_gpu

MODES = ("int8", "int4", "fp8")
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP = 32
INT4_MAX = 7
INT8_MAX = 127
FP8_MAX = 448.0  # largest finite float8_e4m3fn


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """A weight of `shape` as quantized `values` and float `scales`; `tiled` when in the CPU kernel's layout.

    rows layout: int8/fp8 values [K, N], scales f32 [N]; int4 values u8 [K / 2, N], scales bf16 [K / group, N]
    (a checkpoint's: float16 or float32 too), zeros None or u8 [K / group, N] (a group's zero level, 0..16).
    tiled layout (CPU kernel, int8/int4 only): see `cpu_kernels.packed_quant`.
    gpu_kernel: bf16 products of up to KERNEL_ROWS rows (decode) run the Pallas Triton kernel
    (`interpret`: in interpret mode, for checks off the GPU); others the XLA dot.
    """

    values: jax.Array
    scales: jax.Array
    shape: tuple[int, ...] = dataclasses.field(metadata={"static": True})
    contract: int = dataclasses.field(metadata={"static": True})
    mode: str = dataclasses.field(metadata={"static": True})
    group: int = dataclasses.field(default=0, metadata={"static": True})
    tiled: bool = dataclasses.field(default=False, metadata={"static": True})
    gpu_kernel: bool = dataclasses.field(default=False, metadata={"static": True})
    interpret: bool = dataclasses.field(default=False, metadata={"static": True})
    zeros: jax.Array | None = None
    perm: jax.Array | None = None  # int4 from act order: int32 [K], values row i is input perm[i]

    @property
    def in_size(self) -> int:
        return math.prod(self.shape[: self.contract])

    @property
    def out_size(self) -> int:
        return math.prod(self.shape[self.contract :])


def check_mode(mode: str, group: int = DEFAULT_GROUP, field: str = "quantization") -> None:
    """Raise naming the field when mode or group is not accepted (or fp8 is unavailable)."""
    if mode not in MODES:
        raise ValueError(f"{field}={mode!r} is not accepted; use None or one of {', '.join(map(repr, MODES))}")
    if mode == "int4" and group not in GROUP_SIZES:
        raise ValueError(f"int4 group size {group!r} is not accepted; use one of {GROUP_SIZES}")
    if mode == "fp8" and not hasattr(jnp, "float8_e4m3fn"):
        raise ValueError(f"{field}='fp8' needs float8_e4m3fn, which this jax ({jax.__version__}) lacks")


def _absmax(w: jax.Array, axis: int) -> jax.Array:
    """Per-slice max |w|, with all-zero slices given 1 (their values quantize to 0 anyway)."""
    m = jnp.max(jnp.abs(w), axis=axis)
    return jnp.where(m > 0, m, 1.0)


@jax.jit
def _int8(w2: jax.Array) -> tuple[jax.Array, jax.Array]:
    scales = _absmax(w2, 0) / INT8_MAX
    return jnp.clip(jnp.round(w2 / scales), -INT8_MAX, INT8_MAX).astype(jnp.int8), scales


@jax.jit
def _fp8(w2: jax.Array) -> tuple[jax.Array, jax.Array]:
    scales = _absmax(w2, 0) / FP8_MAX
    return (w2 / scales).astype(jnp.float8_e4m3fn), scales


@functools.partial(jax.jit, static_argnames="group")
def _int4(w2: jax.Array, group: int) -> tuple[jax.Array, jax.Array]:
    k, n = w2.shape
    grouped = w2.reshape(k // group, group, n)
    # Scales are rounded to bf16 first, so values are chosen against the scale actually used.
    scales = (_absmax(grouped, 1) / INT4_MAX).astype(jnp.bfloat16)
    q = jnp.clip(jnp.round(grouped / scales[:, None].astype(jnp.float32)), -8, INT4_MAX).astype(jnp.int32) + 8
    pairs = q.reshape(k // 2, 2, n).astype(jnp.uint8)
    return pairs[:, 0] | (pairs[:, 1] << 4), scales


def quantize(w: jax.Array, contract: int, mode: str, group: int = DEFAULT_GROUP, name: str = "weight") -> QuantizedWeight:
    """w (first `contract` axes its input) quantized to `mode` in the rows layout."""
    check_mode(mode, group)
    k = math.prod(w.shape[:contract])
    w2 = w.reshape(k, -1).astype(jnp.float32)
    if mode == "int8":
        return QuantizedWeight(*_int8(w2), tuple(w.shape), contract, mode)
    if mode == "fp8":
        return QuantizedWeight(*_fp8(w2), tuple(w.shape), contract, mode)
    if k % group:
        raise ValueError(f"int4 group size {group} does not divide {name}'s input size {k}; use one of {GROUP_SIZES} that does")
    return QuantizedWeight(*_int4(w2, group), tuple(w.shape), contract, mode, group)


def int4_rows(values: jax.Array) -> jax.Array:
    """Bytes [K / 2, N] -> signed int4 values [K, N] as int8."""
    lo = (values & 15).astype(jnp.int8) - 8
    hi = (values >> 4).astype(jnp.int8) - 8
    return jnp.stack([lo, hi], axis=1).reshape(2 * values.shape[0], values.shape[1])


def _zero_shifts(zeros: jax.Array) -> jax.Array:
    """Each group's zero level less the symmetric 8 (what `int4_rows` took off), float32 [K / group, N]."""
    return zeros.astype(jnp.float32) - 8


def native_int4(q: QuantizedWeight) -> bool:
    """Whether an int4 weight is in the layout the CPU and GPU kernels read: symmetric, bf16 scales, a group size
    of GROUP_SIZES."""
    return q.zeros is None and q.perm is None and q.scales.dtype == jnp.bfloat16 and q.group in GROUP_SIZES


def dequantize(q: QuantizedWeight, dtype: jnp.dtype = jnp.float32) -> jax.Array:
    """The weight in its original shape and `dtype` (for tests and unquantizing, not for running)."""
    q = untile(q)
    if q.mode == "int4":
        rows = int4_rows(q.values).astype(jnp.float32).reshape(-1, q.group, q.out_size)
        levels = rows if q.zeros is None else rows - _zero_shifts(q.zeros)[:, None]
        w2 = (levels * q.scales[:, None].astype(jnp.float32)).reshape(q.in_size, q.out_size)
        if q.perm is not None:  # stored rows back in input order
            w2 = jnp.zeros_like(w2).at[q.perm].set(w2)
    else:
        w2 = q.values.astype(jnp.float32) * q.scales
    return w2.reshape(q.shape).astype(dtype)


def tile(q: QuantizedWeight) -> QuantizedWeight:
    """int8/int4 in the CPU kernel's tile layout; fp8 (no kernel) and tiled weights as they are."""
    if q.tiled or q.mode == "fp8" or (q.mode == "int4" and not native_int4(q)):
        return q
    if q.mode == "int8":
        return dataclasses.replace(q, values=pair_tiles(q.values), scales=pad_columns(q.scales), tiled=True)
    return dataclasses.replace(q, values=int4_tiles(q.values), scales=tile_group_scales(q.scales), tiled=True)


def untile(q: QuantizedWeight) -> QuantizedWeight:
    """The rows layout back from `tile`."""
    if not q.tiled:
        return q
    if q.mode == "int8":
        values, scales = pair_untiles(q.values, q.in_size, q.out_size), q.scales[: q.out_size]
    else:
        values = from_int4_tiles(q.values, q.in_size, q.out_size)
        scales = untile_group_scales(q.scales, q.out_size)
    return dataclasses.replace(q, values=values, scales=scales, tiled=False)


def gpu_kernel_fits(q: QuantizedWeight) -> bool:
    """Whether the Triton kernel takes q: int8/int4 rows layout, a power-of-two input (Triton blocks
    are powers of two and the kernel holds whole input rows) and outputs in blocks of 16."""
    k = q.in_size
    power_of_two = k >= 2 * KERNEL_ROWS and k & (k - 1) == 0
    native = q.mode == "int8" or (q.mode == "int4" and native_int4(q))
    return native and not q.tiled and power_of_two and q.out_size % 16 == 0


def for_gpu_kernel(q: QuantizedWeight, interpret: bool = False) -> QuantizedWeight:
    """q marked to run its decode products through the Triton kernel, where the kernel takes it."""
    return dataclasses.replace(q, gpu_kernel=True, interpret=interpret) if gpu_kernel_fits(q) else q


def quantized_matmul(x2: jax.Array, q: QuantizedWeight) -> jax.Array:
    """x2 [M, K] @ q as float32 [M, N]: a kernel where q is laid out or marked for one, else one
    XLA dot per weight (or group)."""
    if q.tiled:
        return tiled_matmuls(x2, [q])[0]
    # float32 models stay exact: the kernel rounds activations to bf16.
    if q.gpu_kernel and x2.shape[0] <= KERNEL_ROWS and x2.dtype == jnp.bfloat16:
        if q.mode == "int4":
            return int4_matmul_gpu(x2, q.values, q.scales, q.group, interpret=q.interpret)
        return int8_matmul_gpu(x2, q.values, q.scales, interpret=q.interpret)
    compute = jnp.float32 if x2.dtype == jnp.float32 else jnp.bfloat16
    x2 = x2.astype(compute) if q.perm is None else jnp.take(x2.astype(compute), q.perm, axis=1)
    if q.mode != "int4":
        w2 = q.values.astype(compute)
        y = jnp.dot(x2, w2, precision=matmul_precision(x2, w2), preferred_element_type=jnp.float32)
        return y * q.scales
    groups = q.scales.shape[0]
    if jax.default_backend() == "cpu":  # XLA:CPU has no batched bf16 x bf16 -> f32 dot
        compute, x2 = jnp.float32, x2.astype(jnp.float32)
    w3 = int4_rows(q.values).astype(compute).reshape(groups, q.group, q.out_size)
    xg = x2.reshape(-1, groups, q.group)
    y = jnp.einsum("mgk,gkn->mgn", xg, w3, precision=matmul_precision(x2, w3), preferred_element_type=jnp.float32)
    if q.zeros is not None:  # x (levels - z) = x (levels - 8) - (z - 8) sum(x) over each group
        y = y - jnp.sum(xg.astype(jnp.float32), axis=2)[:, :, None] * _zero_shifts(q.zeros)[None]
    # Scaling the group sums is a dot too: exact for float32 models, the fast default for bf16 ones.
    return jnp.einsum("mgn,gn->mn", y, q.scales.astype(jnp.float32), precision=matmul_precision(x2))


def one_kernel_call(qs: list[QuantizedWeight]) -> bool:
    """Whether the weights can share one CPU kernel call: all tiled, one mode and group, one input size."""
    first = qs[0]
    return all(q.tiled and (q.mode, q.group, q.in_size) == (first.mode, first.group, first.in_size) for q in qs)


def tiled_matmuls(x2: jax.Array, qs: list[QuantizedWeight]) -> list[jax.Array]:
    """x2 [M, K] @ each tiled weight (see `one_kernel_call`) as float32 [M, N_i], in one kernel call."""
    matmul = int8_tiles_matmul if qs[0].mode == "int8" else int4_tiles_matmul
    return matmul(x2, [(q.values, q.scales, q.out_size) for q in qs])


def _merged_axis(spec: tuple[str | None, ...]) -> str | None:
    """The mesh axis of dims merged into one matrix dim: the first dim's, when it is the only one split.

    Contiguous equal chunks of the merged dim are then exactly the first dim's chunks (a split
    head keeps its head_dim); a split anywhere else would interleave, so the dim stays whole.
    """
    if not spec or spec[0] is None or any(a is not None for a in spec[1:]):
        return None
    return spec[0]


def quantized_specs(
    q: QuantizedWeight, axes: tuple[str | None, ...], layout: Layout
) -> tuple[PartitionSpec, PartitionSpec]:
    """(values, scales) specs of q from the logical axes of the weight it replaces (rows layout).

    Values [K, N] split like the weight's input and output; scales along the output only, and
    int4's per-group scales [K / group, N] along the input too when the groups split evenly
    (each device then holds whole groups; otherwise the input dim stays whole).
    """
    if q.tiled:
        raise ValueError("a QuantizedWeight tiled for the CPU kernel cannot be sharded; untile it first")
    spec = tuple(layout.spec(q.shape, axes))
    in_axis, out_axis = _merged_axis(spec[: q.contract]), _merged_axis(spec[q.contract :])
    if q.mode != "int4":
        return PartitionSpec(in_axis, out_axis), PartitionSpec(out_axis)
    if in_axis is not None and (q.in_size // q.group) % layout.axis_size(in_axis):
        in_axis = None
    return PartitionSpec(in_axis, out_axis), PartitionSpec(in_axis, out_axis)


def shard_quantized(q: QuantizedWeight, axes: tuple[str | None, ...], layout: Layout) -> QuantizedWeight:
    """q with values and scales moved to their shardings on layout's mesh (q itself when unsharded)."""
    if layout.mesh is None:
        return q
    values_spec, scales_spec = quantized_specs(q, axes, layout)
    # zeros: one per scale; perm (act order's input order) whole on every device
    specs = dict(values=values_spec, scales=scales_spec, zeros=scales_spec, perm=PartitionSpec())
    arrays = {name: getattr(q, name) for name in specs if getattr(q, name) is not None}
    shardings = {name: NamedSharding(layout.mesh, specs[name]) for name in arrays}
    # A jitted copy reshards arrays that span processes too (device_put needs them addressable).
    return dataclasses.replace(q, **jax.jit(lambda a: a, out_shardings=shardings)(arrays))
