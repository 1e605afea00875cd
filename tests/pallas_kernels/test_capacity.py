"""Lengths past the page table's capacity: kernels read only the table, and match the reference.

Speculative verification queries up to K positions beyond the last cached token, so near the
end of the buffer `lengths` exceeds pages_per_seq * page_size. A query there sees every key
the table holds; the kernels must never index the table past its row (the TPU interpreter
raises on the out-of-range DMA, poisoned pages make the GPU kernel's output NaN).
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import pytest
from paged_kernel_inputs import assert_close, make_inputs

from pallas_kernels import (
    paged_attention_gpu,
    paged_attention_reference,
    paged_attention_tpu,
    ragged_paged_attention_gpu,
    ragged_paged_attention_reference,
    ragged_paged_attention_tpu,
)

F32 = jnp.float32
PAGE_SIZE, PAGES_PER_SEQ = 16, 3
CAPACITY = PAGE_SIZE * PAGES_PER_SEQ
SHAPE = dict(num_q_heads=8, num_kv_heads=2, head_dim=32, page_size=PAGE_SIZE, pages_per_seq=PAGES_PER_SEQ)


def _inputs(lengths, query_lens=None, max_q=1, window=None):
    key = jax.random.key(zlib.crc32(repr((lengths, query_lens, window)).encode()))
    return make_inputs(
        key, lengths=lengths, query_lens=query_lens, max_q=max_q, sliding_window=window,
        out_of_range_entries=True, **SHAPE,
    )


@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_decode_past_capacity(platform, window):
    # The last row's overrun would read past the whole table, not just its own row.
    inputs = _inputs([CAPACITY + 5, 7, CAPACITY + PAGE_SIZE + 1])
    opts = dict(sliding_window=window, pages_per_block=2, interpret=True)
    with jax.default_device(jax.devices("cpu")[0]):
        if platform == "gpu":
            out = paged_attention_gpu(*inputs.decode_args, num_splits=2, **opts)
        else:
            out = paged_attention_tpu(*inputs.decode_args, **opts)
    assert_close(out, paged_attention_reference(*inputs.decode_args, sliding_window=window), F32)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_verify_queries_straddle_capacity(platform):
    # Row 0: queries at capacity-2 .. capacity+2; row 2: every query past the end.
    inputs = _inputs([CAPACITY + 3, 9, CAPACITY + 9], query_lens=[5, 3, 5], max_q=5)
    opts = dict(pages_per_block=1, block_rows=16, interpret=True)
    with jax.default_device(jax.devices("cpu")[0]):
        if platform == "gpu":
            out = ragged_paged_attention_gpu(*inputs.ragged_args, num_splits=1, **opts)
        else:
            out = ragged_paged_attention_tpu(*inputs.ragged_args, **opts)
    assert_close(out, ragged_paged_attention_reference(*inputs.ragged_args), F32)
