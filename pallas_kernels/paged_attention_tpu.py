"""Paged attention on TPU with Mosaic (decode; shared by ragged).

Grid: (batch, kv_heads, query blocks). Lengths, query lengths and the flattened
page table are scalar-prefetched into SMEM; the pages stay in HBM and are copied
page by page into a double-buffered VMEM block with `make_async_copy`, so the DMA
of block i+1 overlaps the math of block i. Every DMA started in a grid step is
waited in the same step, so grid steps are independent (all "parallel").
Runs on CPU under the TPU interpret mode (`interpret=True`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import _paged_common as common
from pallas_kernels._paged_common import AttentionParams

# `CompilerParams` since jax 0.6; older releases named it `TPUCompilerParams`.
_CompilerParams = getattr(pltpu, "CompilerParams", None) or getattr(pltpu, "TPUCompilerParams")

LANES = 128  # keys per block default: one vreg row of logits
ROW_ALIGN = 16  # rows per block are a multiple of the bf16 sublane tile
MAX_BLOCK_ROWS = 128


def _page_dma(
    srcs: tuple, bufs: tuple, sems, page_indices_ref, b: jax.Array, h: jax.Array,
    first_page: jax.Array, last_page: jax.Array, ppb: int, pages_per_seq: int,
) -> tuple[Callable[[jax.Array, jax.Array], None], Callable[[jax.Array, jax.Array], None]]:
    """(start, wait) callables that move the needed pages of key block `blk` into a slot.

    srcs: HBM refs [num_kv_heads, num_pages, page_size(, head_dim)]; bufs: VMEM refs
    [2, ppb, page_size(, head_dim)]; sems: DMA semaphores [2]. Pages outside
    [first_page, last_page] are neither copied nor waited for: their table entries
    may be stale or out of range.
    """

    def for_each_page(blk, slot, action):
        for j in range(ppb):
            page_pos = blk * ppb + j

            @pl.when((page_pos >= first_page) & (page_pos <= last_page))
            def _():
                page_id = page_indices_ref[b * pages_per_seq + page_pos]
                for src, buf in zip(srcs, bufs):
                    action(pltpu.make_async_copy(src.at[h, page_id], buf.at[slot, j], sems.at[slot]))

    def start(blk, slot):
        for_each_page(blk, slot, lambda copy: copy.start())

    def wait(blk, slot):
        for_each_page(blk, slot, lambda copy: copy.wait())

    return start, wait


def _kernel(
    lengths_ref,  # SMEM [batch] int32
    query_lens_ref,  # SMEM [batch] int32
    page_indices_ref,  # SMEM [batch * pages_per_seq] int32
    row_query_ref,  # VMEM [block_rows, 1] int32, query index of each row
    q_ref,  # VMEM [block_rows, head_dim]
    k_pages_hbm,  # HBM [num_kv_heads, num_pages, page_size, head_dim]
    v_pages_hbm,  # HBM [num_kv_heads, num_pages, page_size, head_dim]
    *refs,  # [sinks_ref], [slopes_ref], [k_scales_hbm, v_scales_hbm], o_ref, k_buf, v_buf, [ks_buf, vs_buf], sems
    params: AttentionParams,
    pages_per_seq: int,
    has_sinks: bool,
    has_alibi: bool = False,
) -> None:
    """One (sequence, kv head, query block): double-buffered online softmax over key blocks; with
    sinks (VMEM [block_rows, 1] f32, each row's head's) the softmax starts from the sink; with ALiBi slopes
    (the same layout) each row's scores are biased by its head's slope times the keys' distance."""
    sinks_ref, *refs = refs if has_sinks else (None, *refs)
    slopes_ref, *refs = refs if has_alibi else (None, *refs)
    if params.quantized:
        k_sc_hbm, v_sc_hbm, o_ref, k_buf, v_buf, ks_buf, vs_buf, sems = refs
        srcs, bufs = (k_pages_hbm, v_pages_hbm, k_sc_hbm, v_sc_hbm), (k_buf, v_buf, ks_buf, vs_buf)
    else:
        o_ref, k_buf, v_buf, sems = refs
        ks_buf = vs_buf = None
        srcs, bufs = (k_pages_hbm, v_pages_hbm), (k_buf, v_buf)
    b, h = pl.program_id(0), pl.program_id(1)
    block_rows, head_dim = q_ref.shape
    ppb, block_k = params.pages_per_block, params.block_k
    length, query_len = lengths_ref[b], query_lens_ref[b]
    first_row = pl.program_id(2) * block_rows
    capacity = pages_per_seq * params.page_size
    key_lo, key_hi = common.key_range(length, query_len, first_row, block_rows, params, capacity)
    blk_lo, blk_hi = common.block_range(key_lo, key_hi, block_k, 1, jnp.int32(0))
    first_page = lax.div(key_lo, jnp.int32(params.page_size))
    last_page = lax.div(jnp.maximum(key_hi - 1, 0), jnp.int32(params.page_size))

    start, wait = _page_dma(
        srcs, bufs, sems, page_indices_ref, b, h, first_page, last_page, ppb, pages_per_seq
    )

    @pl.when(blk_lo < blk_hi)
    def _prefetch_first():
        start(blk_lo, 0)

    q = q_ref[...].astype(jnp.float32)
    row_query = row_query_ref[...]
    slopes = None if slopes_ref is None else slopes_ref[...]

    def body(blk, carry):
        slot = lax.rem(blk - blk_lo, 2)

        @pl.when(blk + 1 < blk_hi)
        def _prefetch_next():
            start(blk + 1, 1 - slot)

        wait(blk, slot)
        return _attend_block(
            carry, q, row_query, (k_buf, v_buf, ks_buf, vs_buf), slot, blk, key_lo, key_hi,
            length, query_len, params, slopes,
        )

    carry = common.initial_carry(block_rows, head_dim) if sinks_ref is None else common.sink_carry(
        sinks_ref[...], head_dim)
    o, _, l = lax.fori_loop(blk_lo, blk_hi, body, carry)
    o_ref[...] = common.normalize(o, l).astype(o_ref.dtype)


def _attend_block(
    carry: tuple[jax.Array, jax.Array, jax.Array], q: jax.Array, row_query: jax.Array,
    buffers: tuple, slot: jax.Array, blk: jax.Array, key_lo: jax.Array, key_hi: jax.Array,
    length: jax.Array, query_len: jax.Array, params: AttentionParams, slopes: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Score one VMEM block into the carry.

    buffers: k_buf, v_buf [2, ppb, page_size, head_dim] and ks_buf, vs_buf
    [2, ppb, page_size] (None unless quantized); q [rows, head_dim] f32;
    row_query [rows, 1] int32; slopes [rows, 1] f32 ALiBi slopes or None.
    """
    k_buf, v_buf, ks_buf, vs_buf = buffers
    block_k = params.block_k
    head_dim = k_buf.shape[-1]
    # Upcast before merging (ppb, page_size) so packed int8/bf16 tiles never reshape.
    k = k_buf[slot].astype(jnp.float32).reshape(block_k, head_dim)
    v = v_buf[slot].astype(jnp.float32).reshape(block_k, head_dim)
    key_row = blk * block_k + lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
    key_col = blk * block_k + lax.broadcasted_iota(jnp.int32, (block_k, 1), 0)
    # Slots of skipped pages hold stale or uninitialised VMEM: 0 * NaN would leak.
    v = jnp.where((key_col >= key_lo) & (key_col < key_hi), v, 0.0)
    row_ok = (key_row >= key_lo) & (key_row < key_hi)
    k_scale = v_scale = None
    if ks_buf is not None:
        k_scale = ks_buf[slot].reshape(1, block_k)
        v_scale = jnp.where(row_ok, vs_buf[slot].reshape(1, block_k), 0.0)
    logits = common.scaled_logits(q, k, k_scale, params)
    if slopes is not None:
        logits = logits + common.alibi_bias(slopes, row_query, key_row, length, query_len)
    # row_ok also drops keys past the table's capacity, which the causal mask would keep.
    mask = row_ok & common.attention_mask(row_query, key_row, length, query_len, params.sliding_window,
                                          params.attention_chunk)
    return common.online_softmax_step(carry, logits, mask, v, v_scale)


def _scratch_shapes(params: AttentionParams, head_dim: int, kv_dtype: jnp.dtype) -> list:
    """Double-buffered VMEM blocks for K, V (and their scales) plus one DMA semaphore per slot."""
    page_block = (2, params.pages_per_block, params.page_size, head_dim)
    shapes = [pltpu.VMEM(page_block, kv_dtype), pltpu.VMEM(page_block, kv_dtype)]
    if params.quantized:
        scale_block = (2, params.pages_per_block, params.page_size)
        shapes += [pltpu.VMEM(scale_block, jnp.float32), pltpu.VMEM(scale_block, jnp.float32)]
    return shapes + [pltpu.SemaphoreType.DMA((2,))]


def tpu_block_rows(num_rows: int, block_rows: int | None) -> int:
    """Rows per program: a multiple of ROW_ALIGN, at most MAX_BLOCK_ROWS unless given."""
    if block_rows is None:
        block_rows = min(MAX_BLOCK_ROWS, num_rows)
    return pl.cdiv(block_rows, ROW_ALIGN) * ROW_ALIGN


def paged_flash_tpu(
    q: jax.Array,  # [batch, max_q, num_q_heads, head_dim]
    k_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    v_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    lengths: jax.Array,  # [batch] int32
    page_indices: jax.Array,  # [batch, pages_per_seq] int32
    query_lens: jax.Array,  # [batch] int32
    k_scales: jax.Array | None,  # [num_kv_heads, num_pages, page_size] f32
    v_scales: jax.Array | None,  # [num_kv_heads, num_pages, page_size] f32
    *,
    params: AttentionParams,
    block_rows: int | None,
    interpret: bool,
    sinks: jax.Array | None = None,  # [num_q_heads] attention-sink logits
    alibi_slopes: jax.Array | None = None,  # [num_q_heads] ALiBi slopes
) -> jax.Array:
    """Run the kernel on query rows; returns [batch, max_q, num_q_heads, head_dim] in q.dtype."""
    batch, max_q, num_q_heads, head_dim = q.shape
    num_kv_heads = k_pages.shape[0]
    pages_per_seq = page_indices.shape[1]
    block_rows = tpu_block_rows(max_q * params.group, block_rows)
    num_rows = pl.cdiv(max_q * params.group, block_rows) * block_rows
    rows = common.queries_to_rows(q, num_kv_heads, num_rows)
    row_block = pl.BlockSpec((None, None, block_rows, head_dim), lambda b, h, r, *_: (b, h, r, 0))
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    # Per-head sinks and slopes, each read as a VMEM block [block_rows, 1] beside the query rows.
    per_row = tuple(common.head_rows(x, num_kv_heads, max_q, num_rows) for x in (sinks, alibi_slopes) if x is not None)
    per_row_specs = [pl.BlockSpec((None, block_rows, 1), lambda b, h, r, *_: (h, r, 0))] * len(per_row)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(batch, num_kv_heads, num_rows // block_rows),
        in_specs=[pl.BlockSpec((block_rows, 1), lambda b, h, r, *_: (r, 0)), row_block, hbm, hbm]
        + per_row_specs + ([hbm, hbm] if params.quantized else []),
        out_specs=row_block,
        scratch_shapes=_scratch_shapes(params, head_dim, k_pages.dtype),
    )
    out = pl.pallas_call(
        functools.partial(_kernel, params=params, pages_per_seq=pages_per_seq, has_sinks=sinks is not None,
                          has_alibi=alibi_slopes is not None),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((batch, num_kv_heads, num_rows, head_dim), q.dtype),
        compiler_params=_CompilerParams(dimension_semantics=("parallel", "parallel", "parallel")),
        interpret=pltpu.InterpretParams() if interpret else False,
        name="paged_attention_tpu",
    )(
        lengths.astype(jnp.int32), query_lens.astype(jnp.int32),
        page_indices.astype(jnp.int32).reshape(-1),
        common.row_query_index(max_q, params.group, num_rows), rows, k_pages, v_pages, *per_row,
        *((k_scales, v_scales) if params.quantized else ()),
    )
    return common.rows_to_queries(out, max_q, num_q_heads)


def tpu_params(
    q_heads: int,
    k_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    k_scales: jax.Array | None,
    sm_scale: float | None,
    soft_cap: float | None,
    sliding_window: int | None,
    pages_per_block: int | None,
    attention_chunk: int | None = None,
) -> AttentionParams:
    """Static kernel settings for TPU: blocks of about one lane width of keys."""
    num_kv_heads, _, page_size, head_dim = k_pages.shape
    if pages_per_block is None:
        pages_per_block = max(1, LANES // page_size)
    return AttentionParams(
        group=q_heads // num_kv_heads, page_size=page_size, pages_per_block=pages_per_block,
        sm_scale=common.default_sm_scale(head_dim, sm_scale), soft_cap=soft_cap,
        sliding_window=sliding_window, quantized=k_scales is not None, attention_chunk=attention_chunk,
    )


@functools.partial(
    jax.jit,
    static_argnames=("sm_scale", "soft_cap", "sliding_window", "attention_chunk", "pages_per_block", "interpret"),
)
def paged_attention_tpu(
    q: jax.Array,  # [batch, num_q_heads, head_dim]
    k_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    v_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    lengths: jax.Array,  # [batch] int32, >= 1
    page_indices: jax.Array,  # [batch, pages_per_seq] int32
    *,
    sm_scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
    attention_chunk: int | None = None,  # Llama 4: a query sees only its own chunk of positions
    k_scales: jax.Array | None = None,  # [num_kv_heads, num_pages, page_size] f32
    v_scales: jax.Array | None = None,  # [num_kv_heads, num_pages, page_size] f32
    pages_per_block: int | None = None,
    interpret: bool = False,
    sinks: jax.Array | None = None,  # [num_q_heads] f32 attention-sink logits
    alibi_slopes: jax.Array | None = None,  # [num_q_heads] f32 ALiBi slopes (BLOOM, MPT)
) -> jax.Array:
    """Decode attention for the token at position lengths-1: [batch, num_q_heads, head_dim]."""
    _, num_q_heads, head_dim = q.shape
    common.validate_paged_inputs(
        num_q_heads, head_dim, k_pages, v_pages, k_scales, v_scales, sliding_window
    )
    params = tpu_params(num_q_heads, k_pages, k_scales, sm_scale, soft_cap, sliding_window, pages_per_block,
                        attention_chunk)
    out = paged_flash_tpu(
        q[:, None], k_pages, v_pages, lengths, page_indices, jnp.ones_like(lengths),
        k_scales, v_scales, params=params, block_rows=None, interpret=interpret, sinks=sinks,
        alibi_slopes=alibi_slopes,
    )
    return out[:, 0]
