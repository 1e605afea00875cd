"""The Pallas paged kernels on a mesh: one kernel call per device under `shard_map`.

A Mosaic or Triton custom call has no partitioning rule, so XLA would gather its operands
onto every device and run the whole kernel there. Under `shard_map` each device runs it on
its own slices: q split by q heads over tp (and by rows over dp when they divide), the pools
by kv heads over tp, the row metadata (lengths, page table, query lengths) split like q's
rows. Pools never split over dp (any row may map any page), so each dp group reads all pages.

When kv_heads < tp the pools hold every kv head on every device (`Layout.spec` keeps them
whole). With tp % kv_heads == 0 the H / tp query heads of one device all share one kv head,
(device's first query head) // (H / kv_heads), which that device slices out of the pool.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax.sharding import PartitionSpec

from jaxinfer.cache.paged import POOL_AXES, SCALE_AXES
from jaxinfer.parallel.sharding import TP, Layout, shard_map

Q_AXES = ("batch", None, "q_heads", "head_dim")  # [B, T, H, K]
ROW_AXES = ("batch",)  # lengths, query_lens [B]
TABLE_AXES = ("batch", None)  # page table [B, pages_per_row]

# (q, k_pages, v_pages, lengths, page_table, query_lens, *scales) -> [B, T, H, K] like q
RowsKernel = Callable[..., jax.Array]


def query_spec(layout: Layout, q_shape: tuple[int, ...], num_kv_heads: int, kv_split: bool) -> PartitionSpec:
    """q's spec: heads over tp unless a device's query heads would straddle kv heads it does not hold."""
    spec = layout.spec(q_shape, Q_AXES)
    heads = q_shape[2]
    if spec[2] is None or kv_split:
        return spec
    group, local = heads // num_kv_heads, heads // layout.axis_size(TP)
    if group % local:  # whole pools, but one device's heads use several kv heads: keep q whole too
        return PartitionSpec(spec[0], None, None, spec[3])
    return spec


def per_shard_rows_attention(
    kernel: RowsKernel,
    q: jax.Array,  # [B, T, H, K]
    pools: tuple[jax.Array, jax.Array],  # k, v pages [KV, P, page_size, K]
    scales: tuple[jax.Array, ...],  # () or k, v scales [KV, P, page_size]
    rows: tuple[jax.Array, jax.Array, jax.Array],  # lengths [B], page_table [B, pages], query_lens [B]
    layout: Layout,
    sinks: jax.Array | None = None,  # [H] attention-sink logits, split like q's heads
    alibi: jax.Array | None = None,  # [H] ALiBi slopes, split like q's heads
) -> jax.Array:
    """kernel run by every device of layout's mesh on its shard; the result is split like q."""
    num_kv_heads = pools[0].shape[0]
    pool_spec = layout.spec(pools[0].shape, POOL_AXES)
    kv_split = pool_spec[0] is not None
    q_spec = query_spec(layout, q.shape, num_kv_heads, kv_split)
    # Whole pools under split query heads: each device takes the one kv head its heads share.
    slice_kv = q_spec[2] is not None and not kv_split and num_kv_heads > 1
    group, local = q.shape[2] // num_kv_heads, q.shape[2] // layout.axis_size(TP)

    def shard(q_part: jax.Array, k_pages: jax.Array, v_pages: jax.Array, *rest: jax.Array) -> jax.Array:
        row_parts, scale_parts, heads_parts = rest[:3], rest[3 : 3 + len(scales)], rest[3 + len(scales) :]
        kv = (k_pages, v_pages, *scale_parts)
        if slice_kv:  # a copy of one kv head's pages per call: the kernels take no head offset
            first = jax.lax.axis_index(TP) * local // group
            kv = tuple(jax.lax.dynamic_slice_in_dim(x, first, 1, axis=0) for x in kv)
        return kernel(q_part, kv[0], kv[1], *row_parts, *kv[2:], **dict(zip(per_head, heads_parts)))

    # Per-head vectors (sinks, ALiBi slopes): each device takes its own heads' values.
    per_head = {name: x for name, x in (("sinks", sinks), ("alibi", alibi)) if x is not None}
    row_spec = layout.spec(rows[0].shape, ROW_AXES)
    in_specs = (
        q_spec, pool_spec, pool_spec, row_spec, layout.spec(rows[1].shape, TABLE_AXES), row_spec,
        *(layout.spec(s.shape, SCALE_AXES) for s in scales),
        *(PartitionSpec(q_spec[2]) for _ in per_head),
    )
    operands = (q, *pools, *rows, *scales, *per_head.values())
    return shard_map(shard, layout, in_specs, q_spec)(*operands)
