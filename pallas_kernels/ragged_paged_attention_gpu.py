"""Ragged multi-query paged attention on GPU (speculative verify, chunked prefill).

Same Triton kernel as decode (`paged_attention_gpu`): the queries of one sequence
and kv head become rows `query * group + head`, tiled into blocks of up to
`MAX_BLOCK_ROWS` rows; each row attends causally from its own position.
"""

from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl

from pallas_kernels import _paged_common as common
from pallas_kernels.gpu_blocks import MAX_BLOCK_ROWS, MIN_BLOCK
from pallas_kernels.paged_attention_gpu import default_num_splits, gpu_params, paged_flash_gpu


def ragged_block_rows(max_q: int, group: int, block_rows: int | None) -> int:
    """Rows per program: all rows of a sequence when they fit, else MAX_BLOCK_ROWS."""
    if block_rows is None:
        block_rows = min(MAX_BLOCK_ROWS, common.next_power_of_2(max_q * group))
    block_rows = max(MIN_BLOCK, block_rows)
    if block_rows != common.next_power_of_2(block_rows):
        raise ValueError(f"block_rows must be a power of two, got {block_rows}")
    return block_rows


@functools.partial(
    jax.jit,
    static_argnames=(
        "sm_scale", "soft_cap", "sliding_window", "attention_chunk", "pages_per_block", "block_rows",
        "num_splits", "num_warps", "num_stages", "interpret",
    ),
)
def ragged_paged_attention_gpu(
    q: jax.Array,  # [batch, max_q, num_q_heads, head_dim]
    k_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    v_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    lengths: jax.Array,  # [batch] int32, tokens in each sequence (queries included)
    page_indices: jax.Array,  # [batch, pages_per_seq] int32
    query_lens: jax.Array,  # [batch] int32, valid queries: the last query_lens[b] tokens
    *,
    sm_scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
    attention_chunk: int | None = None,  # Llama 4: a query sees only its own chunk of positions
    k_scales: jax.Array | None = None,  # [num_kv_heads, num_pages, page_size] f32
    v_scales: jax.Array | None = None,  # [num_kv_heads, num_pages, page_size] f32
    pages_per_block: int | None = None,
    block_rows: int | None = None,
    num_splits: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    interpret: bool = False,
    sinks: jax.Array | None = None,  # [num_q_heads] f32 attention-sink logits
    alibi_slopes: jax.Array | None = None,  # [num_q_heads] f32 ALiBi slopes (BLOOM, MPT)
) -> jax.Array:
    """Causal multi-query attention: [batch, max_q, num_q_heads, head_dim], padding rows zero."""
    batch, max_q, num_q_heads, head_dim = q.shape
    common.validate_paged_inputs(
        num_q_heads, head_dim, k_pages, v_pages, k_scales, v_scales, sliding_window
    )
    block_rows = ragged_block_rows(max_q, num_q_heads // k_pages.shape[0], block_rows)
    params, num_stages = gpu_params(
        num_q_heads, k_pages, k_scales, sm_scale, soft_cap, sliding_window, pages_per_block,
        block_rows, num_stages, attention_chunk,
    )
    if num_splits is None:
        query_blocks = pl.cdiv(max_q * params.group, block_rows)
        max_blocks = pl.cdiv(page_indices.shape[1], params.pages_per_block)
        num_splits = default_num_splits(batch * k_pages.shape[0] * query_blocks, max_blocks)
    return paged_flash_gpu(
        q, k_pages, v_pages, lengths, page_indices, query_lens, k_scales, v_scales,
        params=params, block_rows=block_rows, num_splits=num_splits,
        num_warps=num_warps, num_stages=num_stages, interpret=interpret, sinks=sinks,
        alibi_slopes=alibi_slopes,
    )
