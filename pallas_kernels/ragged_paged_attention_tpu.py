"""Ragged multi-query paged attention on TPU (speculative verify, chunked prefill).

Same Mosaic kernel as decode (`paged_attention_tpu`): the queries of one sequence
and kv head become rows `query * group + head`, tiled into blocks of rows; each row
attends causally from its own position.
"""

from __future__ import annotations

import functools

import jax

from pallas_kernels import _paged_common as common
from pallas_kernels.paged_attention_tpu import paged_flash_tpu, tpu_params


@functools.partial(
    jax.jit,
    static_argnames=(
        "sm_scale", "soft_cap", "sliding_window", "attention_chunk", "pages_per_block", "block_rows", "interpret",
    ),
)
def ragged_paged_attention_tpu(
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
    interpret: bool = False,
    sinks: jax.Array | None = None,  # [num_q_heads] f32 attention-sink logits
    alibi_slopes: jax.Array | None = None,  # [num_q_heads] f32 ALiBi slopes (BLOOM, MPT)
) -> jax.Array:
    """Causal multi-query attention: [batch, max_q, num_q_heads, head_dim], padding rows zero."""
    _, _, num_q_heads, head_dim = q.shape
    common.validate_paged_inputs(
        num_q_heads, head_dim, k_pages, v_pages, k_scales, v_scales, sliding_window
    )
    params = tpu_params(num_q_heads, k_pages, k_scales, sm_scale, soft_cap, sliding_window, pages_per_block,
                        attention_chunk)
    return paged_flash_tpu(
        q, k_pages, v_pages, lengths, page_indices, query_lens, k_scales, v_scales,
        params=params, block_rows=block_rows, interpret=interpret, sinks=sinks,
        alibi_slopes=alibi_slopes,
    )
