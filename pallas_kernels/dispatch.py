"""Pick the paged attention implementation for the platform.

TPU -> Mosaic kernel, GPU -> Triton kernel, CPU -> the jnp reference, or the GPU
kernel in interpret mode when `interpret=True` (the TPU kernel under the TPU
interpret mode when also `backend="tpu"`). The choice is made per call at trace
time from explicit arguments, never from environment variables.
"""

from __future__ import annotations

from typing import Literal

import jax

from pallas_kernels.paged_attention_gpu import paged_attention_gpu
from pallas_kernels.paged_attention_reference import (
    paged_attention_reference,
    ragged_paged_attention_reference,
)
from pallas_kernels.paged_attention_tpu import paged_attention_tpu
from pallas_kernels.ragged_paged_attention_gpu import ragged_paged_attention_gpu
from pallas_kernels.ragged_paged_attention_tpu import ragged_paged_attention_tpu

Backend = Literal["tpu", "gpu", "cpu", "reference"]
Implementation = Literal["tpu", "gpu", "reference"]


def choose_implementation(backend: str | None, interpret: bool) -> Implementation:
    """Map (platform or explicit backend, interpret) to the implementation that runs."""
    platform = backend or jax.default_backend()
    if platform == "reference":
        return "reference"
    if platform == "tpu":
        return "tpu"
    if platform in ("gpu", "cuda", "rocm"):
        return "gpu"
    if platform == "cpu":
        return "gpu" if interpret else "reference"
    raise ValueError(f"unknown backend {platform!r}; expected tpu, gpu, cpu or reference")


def paged_attention(
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
    interpret: bool = False,
    backend: Backend | None = None,
    pages_per_block: int | None = None,
    num_splits: int | None = None,
    sinks: jax.Array | None = None,  # [num_q_heads] attention-sink logits (GPT-OSS)
    alibi_slopes: jax.Array | None = None,  # [num_q_heads] ALiBi slopes (BLOOM, MPT)
) -> jax.Array:
    """Decode attention for the token at position lengths-1: [batch, num_q_heads, head_dim]."""
    options = dict(
        sm_scale=sm_scale, soft_cap=soft_cap, sliding_window=sliding_window, attention_chunk=attention_chunk,
        k_scales=k_scales, v_scales=v_scales, alibi_slopes=alibi_slopes,
    )
    args = (q, k_pages, v_pages, lengths, page_indices)
    impl = choose_implementation(backend, interpret)
    if impl == "tpu":
        return paged_attention_tpu(*args, **options, pages_per_block=pages_per_block, interpret=interpret,
                                   sinks=sinks)
    if impl == "gpu":
        return paged_attention_gpu(
            *args, **options, pages_per_block=pages_per_block, num_splits=num_splits,
            interpret=interpret, sinks=sinks,
        )
    return paged_attention_reference(*args, **options, sinks=sinks)


def ragged_paged_attention(
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
    interpret: bool = False,
    backend: Backend | None = None,
    pages_per_block: int | None = None,
    block_rows: int | None = None,
    num_splits: int | None = None,
    sinks: jax.Array | None = None,  # [num_q_heads] attention-sink logits (GPT-OSS)
    alibi_slopes: jax.Array | None = None,  # [num_q_heads] ALiBi slopes (BLOOM, MPT)
) -> jax.Array:
    """Causal multi-query attention: [batch, max_q, num_q_heads, head_dim], padding rows zero."""
    options = dict(
        sm_scale=sm_scale, soft_cap=soft_cap, sliding_window=sliding_window, attention_chunk=attention_chunk,
        k_scales=k_scales, v_scales=v_scales, alibi_slopes=alibi_slopes,
    )
    args = (q, k_pages, v_pages, lengths, page_indices, query_lens)
    impl = choose_implementation(backend, interpret)
    if impl == "tpu":
        return ragged_paged_attention_tpu(
            *args, **options, pages_per_block=pages_per_block, block_rows=block_rows,
            interpret=interpret, sinks=sinks,
        )
    if impl == "gpu":
        return ragged_paged_attention_gpu(
            *args, **options, pages_per_block=pages_per_block, block_rows=block_rows,
            num_splits=num_splits, interpret=interpret, sinks=sinks,
        )
    return ragged_paged_attention_reference(*args, **options, sinks=sinks)
