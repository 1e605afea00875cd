"""Experts' gated MLPs over rows sorted by expert: each row through its own expert only.

On GPU and TPU `jax.lax.ragged_dot` lowers to a grouped matmul (XLA's ragged dot, Mosaic's
gmm). On CPU, jax 0.10 lowers it to a masked product with every group (each row multiplied by
every expert's weights, then masked), which is the dense all-experts compute it should avoid;
there the rows are cut into tiles of one expert each and a loop with a data-dependent trip count
visits only the tiles that exist, reading each tile's expert weights once. XLA:GPU may lower
`ragged_dot` so too (each group zero-padded, a batched product with every expert) where no grouped
GEMM takes it; "gathered" multiplies each row by its own expert's gathered weights instead, which
reads only the experts the rows reach: `scripts/bench_moe.py` times the three on a device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.kernels.precision import matmul_precision
from jaxinfer.models.mlp import Gate, gate_product
from jaxinfer.quantization.quantized_experts import (
    QuantizedExperts,
    expert_dot,
    gathered_expert_dot,
    ragged_expert_dot,
    row_experts,
)

IMPLEMENTATIONS = ("auto", "tiled", "ragged_dot", "gathered")
MAX_TILE = 64  # rows per tile: padding per expert is at most MAX_TILE - 1 rows
RowBiases = tuple[jax.Array, jax.Array]  # each row's gate and up biases [N, F], in x's dtype
Experts = jax.Array | QuantizedExperts  # stacked expert weights [E, K, N], as they are or quantized


def tile_rows(num_rows: int, num_groups: int) -> int:
    """Rows per tile: a power of two of at least twice the mean group size, at most MAX_TILE.

    Each tile reads its expert's weights once, so an expert split over two tiles is read twice;
    a tile of up to ~16 rows costs about what its weights take to read (memory bound), so
    rounding up wastes little (decode of one sequence, 2 routed rows over 8 experts: 2).
    """
    target = -(-2 * num_rows // num_groups)
    return min(MAX_TILE, 1 << max(0, target - 1).bit_length())


def _dot(x: jax.Array, experts: Experts, e: jax.Array) -> jax.Array:
    """x [M, K] @ expert e's weights [K, N] accumulated in float32, returned in x's dtype (as a linear layer).

    The weights may be wider than x (16-bit experts held as float32 on CPU, see
    `weight_ops.widen_experts`); x is widened to them, which is exact.
    """
    if isinstance(experts, QuantizedExperts):
        return expert_dot(x, experts, e).astype(x.dtype)
    w = experts[e]
    xw = x.astype(w.dtype)
    return jnp.dot(xw, w, precision=matmul_precision(xw, w), preferred_element_type=jnp.float32).astype(x.dtype)


def tiled_expert_mlp(
    x: jax.Array,  # [N, D] rows sorted by expert
    gate: Experts,  # [E, D, F]
    up: Experts,  # [E, D, F]
    down: Experts,  # [E, F, D]
    group_sizes: jax.Array,  # [E] int32 rows of each expert; rows past their sum give zeros
    act: Gate,
    tile: int | None = None,
    biases: RowBiases | None = None,
) -> jax.Array:
    """Each row through its expert's MLP, tile by tile: [N, D] in x's dtype.

    Each group is cut into tiles of `tile` rows (its last tile running into the next group's
    rows); tiles are visited in row order, so a later tile overwrites those borrowed rows.
    """
    rows, dim = x.shape
    groups = group_sizes.shape[0]
    tile = tile or tile_rows(rows, groups)
    tiles = (group_sizes + tile - 1) // tile  # [E]
    tiles_end = jnp.cumsum(tiles)
    first_row = jnp.cumsum(group_sizes) - group_sizes
    index = jnp.arange(-(-rows // tile) + groups)  # an upper bound on the tiles
    expert = jnp.minimum(jnp.searchsorted(tiles_end, index, side="right"), groups - 1)
    start = first_row[expert] + (index - (tiles_end[expert] - tiles[expert])) * tile
    pad = lambda a: jnp.pad(a, ((0, tile), (0, 0)))  # noqa: E731
    padded = pad(x)
    padded_biases = None if biases is None else tuple(pad(b) for b in biases)

    def visit(j: jax.Array, out: jax.Array) -> jax.Array:
        e, row = expert[j], start[j]
        rows_in = jax.lax.dynamic_slice_in_dim(padded, row, tile)
        g, u = _dot(rows_in, gate, e), _dot(rows_in, up, e)
        if padded_biases is not None:
            g, u = (h + jax.lax.dynamic_slice_in_dim(b, row, tile) for h, b in zip((g, u), padded_biases))
        hidden = gate_product(act, g, u)
        return jax.lax.dynamic_update_slice_in_dim(out, _dot(hidden, down, e), row, axis=0)

    out = jax.lax.fori_loop(0, tiles_end[-1], visit, jnp.zeros_like(padded))[:rows]
    return jnp.where(jnp.arange(rows)[:, None] < jnp.sum(group_sizes), out, 0)


def ragged_expert_mlp(
    x: jax.Array, gate: Experts, up: Experts, down: Experts, group_sizes: jax.Array, act: Gate,
    biases: RowBiases | None = None,
) -> jax.Array:
    """`tiled_expert_mlp` through `jax.lax.ragged_dot` (the accelerators' grouped matmul)."""

    def ragged(a: jax.Array, w: Experts) -> jax.Array:
        if isinstance(w, QuantizedExperts):
            return ragged_expert_dot(a, w, group_sizes).astype(a.dtype)
        out = jax.lax.ragged_dot(a, w, group_sizes, precision=matmul_precision(a, w),
                                 preferred_element_type=jnp.float32)
        return out.astype(a.dtype)

    g, u = ragged(x, gate), ragged(x, up)
    if biases is not None:
        g, u = g + biases[0], u + biases[1]
    out = ragged(gate_product(act, g, u), down)
    return jnp.where(jnp.arange(x.shape[0])[:, None] < jnp.sum(group_sizes), out, 0)


def gathered_expert_mlp(
    x: jax.Array, gate: Experts, up: Experts, down: Experts, group_sizes: jax.Array, act: Gate,
    biases: RowBiases | None = None,
) -> jax.Array:
    """`tiled_expert_mlp` with each row's expert weights gathered: N matrix-vector products over N experts'
    weights, loop-free, reading only the experts rows reach (ragged_dot may lower to a product with every
    expert); for few rows (decode) on accelerators."""
    experts = row_experts(group_sizes, x.shape[0])

    def product(a: jax.Array, w: Experts) -> jax.Array:
        if isinstance(w, QuantizedExperts):
            return gathered_expert_dot(a, w, experts).astype(a.dtype)
        ws = w[experts]
        return jnp.einsum("mk,mkn->mn", a.astype(ws.dtype), ws, precision=matmul_precision(a, ws),
                          preferred_element_type=jnp.float32).astype(a.dtype)

    g, u = product(x, gate), product(x, up)
    if biases is not None:
        g, u = g + biases[0], u + biases[1]
    out = product(gate_product(act, g, u), down)
    return jnp.where(jnp.arange(x.shape[0])[:, None] < jnp.sum(group_sizes), out, 0)


def expert_mlp(
    x: jax.Array, gate: Experts, up: Experts, down: Experts, group_sizes: jax.Array, act: Gate,
    implementation: str = "auto", biases: RowBiases | None = None,
) -> jax.Array:
    """Rows [N, D] sorted by expert through their experts' MLPs; "auto": tiles on CPU, ragged_dot elsewhere.

    "auto" is chosen by the platform the program is lowered for (`lax.platform_dependent`), not the one this
    process runs on, so a step program lowered for a GPU or TPU from a CPU holds what those run.
    biases: each row's gate and up biases [N, F] (its expert's, GPT-OSS), added before the gate.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation {implementation!r} is not one of {IMPLEMENTATIONS}")
    if implementation == "auto":
        return jax.lax.platform_dependent(
            cpu=lambda: tiled_expert_mlp(x, gate, up, down, group_sizes, act, biases=biases),
            default=lambda: ragged_expert_mlp(x, gate, up, down, group_sizes, act, biases),
        )
    if implementation == "tiled":
        return tiled_expert_mlp(x, gate, up, down, group_sizes, act, biases=biases)
    if implementation == "gathered":
        return gathered_expert_mlp(x, gate, up, down, group_sizes, act, biases)
    return ragged_expert_mlp(x, gate, up, down, group_sizes, act, biases)
