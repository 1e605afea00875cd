"""Paged attention on GPU with the Pallas Triton backend (decode; shared by ragged).

Grid: (batch, kv_heads, query blocks, kv splits). One program owns all q heads of
one kv head (GQA reads each page once), walks its share of the sequence in blocks of
`pages_per_block` pages gathered through the page table, and keeps an online
softmax. With more than one split the partial (o, m, l) are merged in plain XLA.
Runs on CPU with `interpret=True`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import _paged_common as common
from pallas_kernels._paged_common import AttentionParams
from pallas_kernels.gpu_blocks import MIN_BLOCK, choose_blocks, padded_head_dim, shared_memory_limit

# `CompilerParams` since jax 0.6; older releases named it `TritonCompilerParams`.
_CompilerParams = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams")

DEFAULT_NUM_CORES = 132  # H100/H200 SM count; used when the device does not say


def _load_block(
    page_indices_ref,  # [batch, pages_per_seq] int32
    pages_ref,  # [num_pages, page_size, head_dim] (this kv head)
    scales_ref,  # [num_pages, page_size] f32, or None
    b: jax.Array,
    blk: jax.Array,
    first_page: jax.Array,
    last_page: jax.Array,
    params: AttentionParams,
) -> tuple[jax.Array, jax.Array | None]:
    """Gather block `blk` of a sequence: ([block_k, head_dim], [1, block_k] scales or None)."""
    ppb = params.pages_per_block
    # Slots outside the needed pages re-read a needed page, so the kernel never
    # touches pages the page table does not vouch for (they may be freed or garbage).
    page_pos = jnp.clip(blk * ppb + jnp.arange(ppb, dtype=jnp.int32), first_page, last_page)
    page_ids = page_indices_ref[b, page_pos]
    values = pages_ref[page_ids]  # [ppb, page_size, head_dim]
    values = values.reshape(params.block_k, values.shape[-1])
    if scales_ref is None:
        return values, None
    return values, scales_ref[page_ids].reshape(1, params.block_k)


def _kernel(
    lengths_ref,  # [batch] int32
    query_lens_ref,  # [batch] int32
    page_indices_ref,  # [batch, pages_per_seq] int32
    row_query_ref,  # [block_rows, 1] int32, query index of each row (>= max_q for padding)
    q_ref,  # [block_rows, head_dim]
    k_pages_ref,  # [num_pages, page_size, head_dim]
    v_pages_ref,  # [num_pages, page_size, head_dim]
    *refs,  # [slopes_ref [block_rows, 1] f32], k_scales_ref, v_scales_ref [num_pages, page_size] when quantized;
    # then outputs
    params: AttentionParams,
    num_splits: int,
    partial: bool,
    has_alibi: bool,
) -> None:
    """One (sequence, kv head, query block, split): online softmax over its key blocks, each row's scores biased
    by its head's ALiBi slope where given; `partial` writes the unnormalised (o, m, l) for a combine outside
    (splits, or sinks)."""
    slopes_ref, *refs = refs if has_alibi else (None, *refs)
    k_scales_ref, v_scales_ref, *out_refs = refs if params.quantized else (None, None, *refs)
    b, split = pl.program_id(0), pl.program_id(3)
    block_rows, head_dim = q_ref.shape
    length, query_len = lengths_ref[b], query_lens_ref[b]
    first_row = pl.program_id(2) * block_rows
    capacity = page_indices_ref.shape[1] * params.page_size
    key_lo, key_hi = common.key_range(length, query_len, first_row, block_rows, params, capacity)
    blk_lo, blk_hi = common.block_range(key_lo, key_hi, params.block_k, num_splits, split)
    first_page = lax.div(key_lo, jnp.int32(params.page_size))
    last_page = lax.div(jnp.maximum(key_hi - 1, 0), jnp.int32(params.page_size))
    row_query = row_query_ref[...]
    q = q_ref[...]
    compute_dtype = q.dtype

    def body(blk, carry):
        load = functools.partial(
            _load_block, page_indices_ref, b=b, blk=blk, first_page=first_page,
            last_page=last_page, params=params,
        )
        k, k_scale = load(k_pages_ref, k_scales_ref)
        v, v_scale = load(v_pages_ref, v_scales_ref)
        key_pos = blk * params.block_k + jnp.arange(params.block_k, dtype=jnp.int32)
        key_ok = (key_pos >= key_lo) & (key_pos < key_hi)
        # Masked probabilities are zero, but 0 * NaN is not: clear unused slots.
        v = jnp.where(key_ok[:, None], v, 0).astype(compute_dtype)
        if v_scale is not None:
            v_scale = jnp.where(key_ok[None, :], v_scale, 0.0)
        logits = common.scaled_logits(q, k.astype(compute_dtype), k_scale, params)
        if slopes_ref is not None:
            logits = logits + common.alibi_bias(slopes_ref[...], row_query, key_pos[None, :], length, query_len)
        # key_ok also drops keys past the table's capacity, which the causal mask would keep.
        mask = key_ok[None, :] & common.attention_mask(
            row_query, key_pos[None, :], length, query_len, params.sliding_window, params.attention_chunk
        )
        return common.online_softmax_step(carry, logits, mask, v, v_scale)

    o, m, l = lax.fori_loop(blk_lo, blk_hi, body, common.initial_carry(block_rows, head_dim))
    if not partial:
        (o_ref,) = out_refs
        o_ref[...] = common.normalize(o, l).astype(o_ref.dtype)
    else:
        o_ref, m_ref, l_ref = out_refs
        o_ref[...] = o
        m_ref[...] = m
        l_ref[...] = l


def default_num_splits(programs: int, max_blocks: int) -> int:
    """Split the sequence until the grid fills the GPU about twice over."""
    num_cores = getattr(jax.devices()[0], "core_count", None) or DEFAULT_NUM_CORES
    return max(1, min(max_blocks, pl.cdiv(2 * num_cores, programs), 16))


def _specs(
    num_pages: int, page_size: int, head_dim: int, block_rows: int, quantized: bool, has_alibi: bool
) -> list[pl.BlockSpec]:
    """BlockSpecs of the kernel inputs, in `_kernel` argument order."""
    whole = pl.no_block_spec  # small int32 tables read with scalar / gather loads
    pages = pl.BlockSpec((None, num_pages, page_size, head_dim), lambda b, h, r, s: (h, 0, 0, 0))
    specs = [
        whole, whole, whole,
        pl.BlockSpec((block_rows, 1), lambda b, h, r, s: (r, 0)),
        pl.BlockSpec((None, None, block_rows, head_dim), lambda b, h, r, s: (b, h, r, 0)),
        pages, pages,
    ]
    if has_alibi:  # each row's slope, laid out as the rows are: [kv_heads, rows, 1]
        specs.append(pl.BlockSpec((None, block_rows, 1), lambda b, h, r, s: (h, r, 0)))
    if quantized:
        scales = pl.BlockSpec((None, num_pages, page_size), lambda b, h, r, s: (h, 0, 0))
        specs += [scales, scales]
    return specs


def _out_shapes_and_specs(
    batch: int, num_kv_heads: int, num_rows: int, head_dim: int, block_rows: int, splits: int,
    dtype: jnp.dtype, partial: bool,
) -> tuple[list[jax.ShapeDtypeStruct], list[pl.BlockSpec]]:
    """Outputs: final rows, or (partial) f32 (o, m, l) per split."""
    if not partial:
        shape = jax.ShapeDtypeStruct((batch, num_kv_heads, num_rows, head_dim), dtype)
        spec = pl.BlockSpec((None, None, block_rows, head_dim), lambda b, h, r, s: (b, h, r, 0))
        return [shape], [spec]
    lead = (batch, num_kv_heads, splits, num_rows)
    shapes = [
        jax.ShapeDtypeStruct((*lead, head_dim), jnp.float32),
        jax.ShapeDtypeStruct((*lead, 1), jnp.float32),
        jax.ShapeDtypeStruct((*lead, 1), jnp.float32),
    ]
    o_spec = pl.BlockSpec((None, None, None, block_rows, head_dim), lambda b, h, r, s: (b, h, s, r, 0))
    ml_spec = pl.BlockSpec((None, None, None, block_rows, 1), lambda b, h, r, s: (b, h, s, r, 0))
    return shapes, [o_spec, ml_spec, ml_spec]


def paged_flash_gpu(
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
    block_rows: int,
    num_splits: int,
    num_warps: int,
    num_stages: int,
    interpret: bool,
    sinks: jax.Array | None = None,  # [num_q_heads] attention-sink logits
    alibi_slopes: jax.Array | None = None,  # [num_q_heads] ALiBi slopes
) -> jax.Array:
    """Run the kernel on query rows; returns [batch, max_q, num_q_heads, head_dim] in q.dtype.

    A head_dim that is not a power of two runs zero-padded (zeros add nothing to q.k, and the
    padded output columns are dropped). The padding copies the pools once per call: a cache
    allocated at the padded head_dim would avoid that copy.
    """
    head_dim = q.shape[-1]
    q, k_pages, v_pages = (_pad_last(x, padded_head_dim(head_dim)) for x in (q, k_pages, v_pages))
    return _flash_rows(
        q, k_pages, v_pages, lengths, page_indices, query_lens, k_scales, v_scales, params=params,
        block_rows=block_rows, num_splits=num_splits, num_warps=num_warps, num_stages=num_stages,
        interpret=interpret, sinks=sinks, alibi_slopes=alibi_slopes,
    )[..., :head_dim]


def _pad_last(x: jax.Array, size: int) -> jax.Array:
    """x zero-padded along its last axis to `size`."""
    if x.shape[-1] == size:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - x.shape[-1])])


def _flash_rows(
    q: jax.Array,  # [batch, max_q, num_q_heads, head_dim], head_dim a power of two
    k_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    v_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    lengths: jax.Array,  # [batch] int32
    page_indices: jax.Array,  # [batch, pages_per_seq] int32
    query_lens: jax.Array,  # [batch] int32
    k_scales: jax.Array | None,  # [num_kv_heads, num_pages, page_size] f32
    v_scales: jax.Array | None,  # [num_kv_heads, num_pages, page_size] f32
    *,
    params: AttentionParams,
    block_rows: int,
    num_splits: int,
    num_warps: int,
    num_stages: int,
    interpret: bool,
    sinks: jax.Array | None,
    alibi_slopes: jax.Array | None,
) -> jax.Array:
    """The pallas_call over query rows: [batch, max_q, num_q_heads, head_dim] in q.dtype.

    With sinks the kernel writes partial results even unsplit: the sinks join in the combine.
    """
    batch, max_q, num_q_heads, head_dim = q.shape
    num_kv_heads, num_pages, page_size, _ = k_pages.shape
    num_rows = pl.cdiv(max_q * params.group, block_rows) * block_rows
    rows = common.queries_to_rows(q, num_kv_heads, num_rows)
    partial = num_splits > 1 or sinks is not None
    out_shapes, out_specs = _out_shapes_and_specs(
        batch, num_kv_heads, num_rows, head_dim, block_rows, num_splits, q.dtype, partial
    )
    has_alibi = alibi_slopes is not None
    kernel = functools.partial(_kernel, params=params, num_splits=num_splits, partial=partial, has_alibi=has_alibi)
    row_slopes = (common.head_rows(alibi_slopes, num_kv_heads, max_q, num_rows),) if has_alibi else ()
    outs = pl.pallas_call(
        kernel,
        grid=(batch, num_kv_heads, num_rows // block_rows, num_splits),
        in_specs=_specs(num_pages, page_size, head_dim, block_rows, params.quantized, has_alibi),
        out_specs=out_specs,
        out_shape=out_shapes,
        compiler_params=_CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="paged_attention_gpu",
    )(
        lengths.astype(jnp.int32), query_lens.astype(jnp.int32), page_indices.astype(jnp.int32),
        common.row_query_index(max_q, params.group, num_rows), rows, k_pages, v_pages, *row_slopes,
        *((k_scales, v_scales) if params.quantized else ()),
    )
    if not partial:
        out_rows = outs[0]
    else:
        row_sinks = None if sinks is None else common.head_rows(sinks, num_kv_heads, max_q, num_rows)
        out_rows = common.combine_splits(*outs, row_sinks)
    return common.rows_to_queries(out_rows.astype(q.dtype), max_q, num_q_heads)


def gpu_params(
    q_heads: int,
    k_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    k_scales: jax.Array | None,
    sm_scale: float | None,
    soft_cap: float | None,
    sliding_window: int | None,
    pages_per_block: int | None,
    block_rows: int,
    num_stages: int | None,
    attention_chunk: int | None = None,
) -> tuple[AttentionParams, int]:
    """Static kernel settings and num_stages; blocks sized to fit the device's shared memory."""
    num_kv_heads, _, page_size, head_dim = k_pages.shape
    if page_size != common.next_power_of_2(page_size):
        raise ValueError(f"GPU paged attention needs a power-of-two page_size, got {page_size}")
    if pages_per_block is not None and pages_per_block != common.next_power_of_2(pages_per_block):
        raise ValueError(f"pages_per_block must be a power of two, got {pages_per_block}")
    limit = shared_memory_limit()
    quantized = k_scales is not None
    blocks = choose_blocks(
        padded_head_dim(head_dim), k_pages.dtype, page_size, block_rows, quantized, limit,
        pages_per_block, num_stages,
    )
    if blocks is None:
        raise ValueError(f"GPU paged attention at head_dim {head_dim} does not fit {limit} bytes of shared memory")
    params = AttentionParams(
        group=q_heads // num_kv_heads, page_size=page_size, pages_per_block=blocks[0],
        sm_scale=common.default_sm_scale(head_dim, sm_scale), soft_cap=soft_cap,
        sliding_window=sliding_window, quantized=quantized, attention_chunk=attention_chunk,
    )
    return params, blocks[1]


@functools.partial(
    jax.jit,
    static_argnames=(
        "sm_scale", "soft_cap", "sliding_window", "attention_chunk", "pages_per_block", "num_splits",
        "num_warps", "num_stages", "interpret",
    ),
)
def paged_attention_gpu(
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
    num_splits: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    interpret: bool = False,
    sinks: jax.Array | None = None,  # [num_q_heads] f32 attention-sink logits
    alibi_slopes: jax.Array | None = None,  # [num_q_heads] f32 ALiBi slopes (BLOOM, MPT)
) -> jax.Array:
    """Decode attention for the token at position lengths-1: [batch, num_q_heads, head_dim]."""
    batch, num_q_heads, head_dim = q.shape
    common.validate_paged_inputs(
        num_q_heads, head_dim, k_pages, v_pages, k_scales, v_scales, sliding_window
    )
    block_rows = max(MIN_BLOCK, common.next_power_of_2(num_q_heads // k_pages.shape[0]))
    params, num_stages = gpu_params(
        num_q_heads, k_pages, k_scales, sm_scale, soft_cap, sliding_window, pages_per_block,
        block_rows, num_stages, attention_chunk,
    )
    if num_splits is None:
        max_blocks = pl.cdiv(page_indices.shape[1], params.pages_per_block)
        num_splits = default_num_splits(batch * k_pages.shape[0], max_blocks)
    out = paged_flash_gpu(
        q[:, None], k_pages, v_pages, lengths, page_indices, jnp.ones_like(lengths),
        k_scales, v_scales, params=params, block_rows=block_rows, num_splits=num_splits,
        num_warps=num_warps, num_stages=num_stages, interpret=interpret, sinks=sinks, alibi_slopes=alibi_slopes,
    )
    return out[:, 0]
