"""Routed experts' stacked weights [E, K, N] stored quantized: a `QuantizedExperts` leaf and its products.

The modes are `quantized_weight`'s, applied to each expert on its own: "int8" and "fp8" keep one
float32 scale per expert and output column, "int4" one bf16 scale per expert, output column and
group of `group` input rows (two values per byte along the input); and "mxfp4" (experts only:
GPT-OSS's released format, `mxfp4_codes`) E2M1 codes two to a byte with a power-of-two scale per
32 input rows. int4 experts read from an AWQ, GPTQ or compressed-tensors checkpoint (`stored_int4`) keep
its scales' dtype and, where asymmetric, a zero level per expert, group and column (`zeros`).
The values keep the experts' axis layout ([E, K, N], 4-bit [E, K / 2, N]), so they
shard like the weights they replace: the experts over ep, the hidden units over tp (4-bit modes
only where each device holds whole groups).

Products read them as they are: one expert's values, widened, in the CPU tile loop, with the
int8/fp8 scales applied to the product; `jax.lax.ragged_dot` over the widened values on
accelerators, scaled per row by its expert's columns (int4: over the dequantized stack, since its
scales vary along the contracted axis). The widened copies are transient: memory at rest is the
quantized bytes, which is what lets a mixture-of-experts model twice or four times its bf16 size fit.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jaxinfer.kernels.precision import matmul_precision
from jaxinfer.parallel.sharding import Layout
from jaxinfer.quantization import mxfp4_codes
from jaxinfer.quantization.quantized_weight import FP8_MAX, INT4_MAX, INT8_MAX, MODES, check_mode, int4_rows

EXPERT_MODES = (*MODES, "mxfp4")
PACKED = ("int4", "mxfp4")  # two 4-bit values a byte along the input, scales per group of inputs


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedExperts:
    """Experts' weights [E, K, N] as quantized `values` and float `scales` (see the module docstring)."""

    values: jax.Array  # int8/fp8 [E, K, N]; int4/mxfp4 uint8 [E, K / 2, N] (row 2i low nibble, 2i + 1 high;
    #                    int4 each + 8, mxfp4 E2M1 codes)
    scales: jax.Array  # int8/fp8 float32 [E, N]; int4 bfloat16 [E, K / group, N]; mxfp4 uint8 exponents [E, K / 32, N]
    mode: str = dataclasses.field(metadata={"static": True})
    group: int = dataclasses.field(default=0, metadata={"static": True})
    zeros: jax.Array | None = None  # int4 from a checkpoint: None (the symmetric 8) or uint8 [E, K / group, N]

    @property
    def shape(self) -> tuple[int, int, int]:
        """The shape of the weights these replace, [E, K, N]."""
        e, k, n = self.values.shape
        return (e, 2 * k if self.mode in PACKED else k, n)


def _absmax(w: jax.Array, axis: int) -> jax.Array:
    """Per-slice max |w| in float32, all-zero slices given 1 (their values quantize to 0 anyway)."""
    m = jnp.max(jnp.abs(w), axis=axis).astype(jnp.float32)
    return jnp.where(m > 0, m, 1.0)


@functools.partial(jax.jit, static_argnames=("mode", "group"))
def _quantize(w: jax.Array, mode: str, group: int) -> tuple[jax.Array, jax.Array]:
    """(values, scales) of w [E, K, N]; the float32 intermediates fuse away (no widened copy of w)."""
    if mode in ("int8", "fp8"):
        scales = _absmax(w, 1) / (INT8_MAX if mode == "int8" else FP8_MAX)
        scaled = w.astype(jnp.float32) / scales[:, None]
        if mode == "fp8":
            return scaled.astype(jnp.float8_e4m3fn), scales
        return jnp.clip(jnp.round(scaled), -INT8_MAX, INT8_MAX).astype(jnp.int8), scales
    e, k, n = w.shape
    grouped = w.reshape(e, k // group, group, n)
    if mode == "mxfp4":
        exponents = mxfp4_codes.exponents(jnp.max(jnp.abs(grouped), axis=2).astype(jnp.float32))
        codes = mxfp4_codes.encode(grouped.astype(jnp.float32) / mxfp4_codes.scale_values(exponents)[:, :, None])
        pairs = codes.reshape(e, k // 2, 2, n)
        return pairs[:, :, 0] | (pairs[:, :, 1] << 4), exponents
    # Scales are rounded to bf16 first, so values are chosen against the scale actually used.
    scales = (_absmax(grouped, 2) / INT4_MAX).astype(jnp.bfloat16)
    q = jnp.round(grouped.astype(jnp.float32) / scales[:, :, None].astype(jnp.float32))
    pairs = (jnp.clip(q, -8, INT4_MAX).astype(jnp.int32) + 8).reshape(e, k // 2, 2, n).astype(jnp.uint8)
    return pairs[:, :, 0] | (pairs[:, :, 1] << 4), scales


def _group_of(mode: str, group: int) -> int:
    """The input rows one scale covers (0: a whole column)."""
    return {"int4": group, "mxfp4": mxfp4_codes.GROUP}.get(mode, 0)


def quantize_experts(w: jax.Array, mode: str, group: int, name: str = "experts") -> QuantizedExperts:
    """Stacked expert weights w [E, K, N] quantized to `mode`, each expert on its own."""
    if mode != "mxfp4":
        check_mode(mode, group)
    group = _group_of(mode, group)
    if group and w.shape[1] % group:
        raise ValueError(f"{mode} group size {group} does not divide {name}'s input size {w.shape[1]}; "
                         + ("use a group size that does, or int8" if mode == "int4" else "use int8"))
    values, scales = _quantize(w, mode, group)
    return QuantizedExperts(values, scales, mode, group)


def _int4_matrix(values: jax.Array, scales: jax.Array, zeros: jax.Array | None, group: int) -> jax.Array:
    """One expert's int4 bytes [K / 2, N], group scales and zero levels [K / group, N] as float32 [K, N]."""
    rows = int4_rows(values).astype(jnp.float32)
    k, n = rows.shape
    levels = rows.reshape(k // group, group, n)
    if zeros is not None:
        levels = levels - (zeros.astype(jnp.float32) - 8)[:, None]
    return (levels * scales[:, None].astype(jnp.float32)).reshape(k, n)


def _mxfp4_matrix(values: jax.Array, exponents: jax.Array) -> jax.Array:
    """One expert's MXFP4 bytes [K / 2, N] and scale exponents [K / 32, N] as float32 [K, N]."""
    rows = jnp.stack([mxfp4_codes.decode(values & 15), mxfp4_codes.decode(values >> 4)], axis=1)
    k, n = 2 * values.shape[0], values.shape[1]
    groups = rows.reshape(k // mxfp4_codes.GROUP, mxfp4_codes.GROUP, n)
    return (groups * mxfp4_codes.scale_values(exponents)[:, None]).reshape(k, n)


def _matrices(q: QuantizedExperts, experts: jax.Array | None = None) -> jax.Array:
    """The float32 [.., K, N] of the 4-bit experts `experts` (None: all of them)."""
    pick = (lambda a: a) if experts is None else (lambda a: a[experts])
    if q.mode == "mxfp4":
        return jax.vmap(_mxfp4_matrix)(pick(q.values), pick(q.scales))
    if q.zeros is None:
        return jax.vmap(lambda v, s: _int4_matrix(v, s, None, q.group))(pick(q.values), pick(q.scales))
    return jax.vmap(functools.partial(_int4_matrix, group=q.group))(pick(q.values), pick(q.scales), pick(q.zeros))


def dequantize_experts(q: QuantizedExperts, dtype: jnp.dtype = jnp.float32) -> jax.Array:
    """All experts' weights [E, K, N] in `dtype`."""
    if q.mode in PACKED:
        return _matrices(q).astype(dtype)
    return (q.values.astype(jnp.float32) * q.scales[:, None]).astype(dtype)


def _compute_dtype(x: jax.Array) -> jnp.dtype:
    """float32 for float32 activations (exact models stay exact), else bfloat16 (16-bit activations)."""
    return jnp.float32 if x.dtype == jnp.float32 else jnp.bfloat16


def expert_dot(x: jax.Array, q: QuantizedExperts, e: jax.Array) -> jax.Array:
    """x [M, K] @ expert e's weights, float32 [M, N]: the CPU tile loop's product, in float32 (as the
    loop's float experts are, `weight_ops.widen_experts`: XLA:CPU's bf16 products run far slower)."""
    xw = x.astype(jnp.float32)
    if q.mode == "int4":
        return _int4_expert_dot(xw, q.values[e], q.scales[e], q.group, None if q.zeros is None else q.zeros[e])
    if q.mode == "mxfp4":
        return _mxfp4_expert_dot(xw, q.values[e], q.scales[e])
    w = q.values[e].astype(jnp.float32)
    return jnp.dot(xw, w, precision=matmul_precision(xw, w), preferred_element_type=jnp.float32) * q.scales[e]


def _int4_expert_dot(x: jax.Array, values: jax.Array, scales: jax.Array, group: int,
                     zeros: jax.Array | None = None) -> jax.Array:
    """float32 x [M, K] @ one expert's int4 bytes [K / 2, N] with group scales (and zero levels) [K / group, N].

    The even input rows are the low nibbles, the odd ones the high: two products over x's even and
    odd columns read each byte once, with no interleaving copy of the unpacked rows (a whole-matrix
    unpack, or per-group sums then scaled, ran 3-4x slower in the CPU tile loop).
    """
    row_scales = jnp.repeat(scales.astype(jnp.float32), group // 2, axis=0)  # [K / 2, N]: each byte's scale
    zero = 8.0 if zeros is None else jnp.repeat(zeros.astype(jnp.float32), group // 2, axis=0)
    low = ((values & 15).astype(jnp.float32) - zero) * row_scales
    high = ((values >> 4).astype(jnp.float32) - zero) * row_scales
    dot = functools.partial(jnp.dot, precision=matmul_precision(x), preferred_element_type=jnp.float32)
    return dot(x[:, 0::2], low) + dot(x[:, 1::2], high)


def _mxfp4_expert_dot(x: jax.Array, values: jax.Array, exponents: jax.Array) -> jax.Array:
    """float32 x [M, K] @ one expert's MXFP4 bytes [K / 2, N] (low nibbles the even rows), as `_int4_expert_dot`."""
    row_scales = jnp.repeat(mxfp4_codes.scale_values(exponents), mxfp4_codes.GROUP // 2, axis=0)
    low = mxfp4_codes.decode(values & 15) * row_scales
    high = mxfp4_codes.decode(values >> 4) * row_scales
    dot = functools.partial(jnp.dot, precision=matmul_precision(x), preferred_element_type=jnp.float32)
    return dot(x[:, 0::2], low) + dot(x[:, 1::2], high)


def row_experts(group_sizes: jax.Array, rows: int) -> jax.Array:
    """The expert of each of `rows` rows sorted by expert ([rows] int32; rows past the groups get the last)."""
    ends = jnp.cumsum(group_sizes)
    # Compared with every end at once: a loop-free lowering (searchsorted's default is a loop).
    found = jnp.searchsorted(ends, jnp.arange(rows), side="right", method="compare_all")
    return jnp.minimum(found, group_sizes.shape[0] - 1)


def ragged_expert_dot(x: jax.Array, q: QuantizedExperts, group_sizes: jax.Array) -> jax.Array:
    """x [M, K] (rows sorted by expert, `group_sizes` per expert) @ each row's expert, float32 [M, N]."""
    compute = _compute_dtype(x)
    xw = x.astype(compute)
    if q.mode in PACKED:
        w = dequantize_experts(q, compute)
        return jax.lax.ragged_dot(xw, w, group_sizes, precision=matmul_precision(xw, w),
                                  preferred_element_type=jnp.float32)
    w = q.values.astype(compute)
    out = jax.lax.ragged_dot(xw, w, group_sizes, precision=matmul_precision(xw, w),
                             preferred_element_type=jnp.float32)
    return out * jnp.take(q.scales, row_experts(group_sizes, x.shape[0]), axis=0)


def gathered_expert_dot(x: jax.Array, q: QuantizedExperts, experts: jax.Array) -> jax.Array:
    """x [M, K] @ the expert `experts[m]` of each row, float32 [M, N]: each row's expert's values gathered."""
    compute = _compute_dtype(x)
    xw = x.astype(compute)
    if q.mode in PACKED:
        w = _matrices(q, experts)
        return jnp.einsum("mk,mkn->mn", xw, w.astype(compute), precision=matmul_precision(xw),
                          preferred_element_type=jnp.float32)
    w = q.values[experts].astype(compute)
    out = jnp.einsum("mk,mkn->mn", xw, w, precision=matmul_precision(xw, w), preferred_element_type=jnp.float32)
    return out * q.scales[experts]


def experts_spec(w: jax.Array | QuantizedExperts, axes: tuple[str | None, ...], layout: Layout,
                 name: str = "experts") -> PartitionSpec | QuantizedExperts:
    """The sharding of an experts leaf from the logical axes of the weights [E, K, N]: a PartitionSpec,
    or for quantized experts a QuantizedExperts whose values and scales are PartitionSpecs.

    int4 values and scales split along the input only where each device holds whole groups (and
    whole bytes); a split input that cannot is refused, since the experts' hidden units must split
    alike in the gate/up and down products.
    """
    spec = layout.spec(w.shape, axes)
    if not isinstance(w, QuantizedExperts):
        return spec
    e_axis, k_axis, n_axis = tuple(spec) + (None,) * (3 - len(spec))
    if w.mode not in PACKED:
        values, scales = PartitionSpec(e_axis, k_axis, n_axis), PartitionSpec(e_axis, n_axis)
        return dataclasses.replace(w, values=values, scales=scales)
    if k_axis is not None and not groups_split(w.shape[1], w.group, layout.axis_size(k_axis)):
        raise ValueError(
            f"{name}: {w.mode} groups of {w.group} rows do not split evenly over {layout.axis_size(k_axis)} devices "
            f"({w.shape[1]} input rows); use a smaller quantization group or int8 experts")
    both = PartitionSpec(e_axis, k_axis, n_axis)
    return dataclasses.replace(w, values=both, scales=both, zeros=None if w.zeros is None else both)


def groups_split(rows: int, group: int, parts: int) -> bool:
    """Whether `rows` input rows in groups of `group` split into `parts` equal runs of whole groups."""
    return (rows // group) % parts == 0


def packed_experts_fit(shape: tuple[int, int, int], axes: tuple[str | None, ...], layout: Layout, group: int) -> bool:
    """Whether experts of `shape` [E, K, N] in a 4-bit mode with `group` rows a scale shard on `layout` (their
    input split into runs of whole groups, or not split)."""
    k_axis = (tuple(layout.spec(shape, axes)) + (None,) * 3)[1]
    return k_axis is None or groups_split(shape[1], group, layout.axis_size(k_axis))


def shard_experts(q: QuantizedExperts, axes: tuple[str | None, ...], layout: Layout,
                  name: str = "experts") -> QuantizedExperts:
    """q with values and scales moved to their shardings on layout's mesh (q itself when unsharded)."""
    if layout.mesh is None:
        return q
    specs = experts_spec(q, axes, layout, name)
    shardings = jax.tree.map(lambda s: jax.sharding.NamedSharding(layout.mesh, s), specs,
                             is_leaf=lambda s: isinstance(s, PartitionSpec))
    return jax.jit(lambda t: t, out_shardings=shardings)(q)
