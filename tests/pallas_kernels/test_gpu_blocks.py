"""Shapes the GPU kernel used to refuse: odd head dims (padded) and float32 blocks sized to fit."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import pytest
from paged_kernel_inputs import assert_close, make_inputs

from pallas_kernels import (
    kernel_supports,
    paged_attention_gpu,
    paged_attention_reference,
    ragged_paged_attention_gpu,
    ragged_paged_attention_reference,
    smem_footprint,
    unsupported_reason,
)
from pallas_kernels.gpu_blocks import MAX_BLOCK_ROWS, choose_blocks, padded_head_dim

F32, BF16 = jnp.float32, jnp.bfloat16
H100_SHARED_MEMORY = 232448


def test_footprint_reproduces_the_h100_refusal():
    # 128-key blocks of float32 at head_dim 128, two stages: what Triton asked for on an H100.
    assert smem_footprint(128, F32, 128, 16, 2, quantized=False) == 270336


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_chosen_blocks_fit_h100(dtype, head_dim):
    for block_rows in (16, MAX_BLOCK_ROWS):
        pages, stages = choose_blocks(head_dim, dtype, 16, block_rows, False, H100_SHARED_MEMORY)
        assert smem_footprint(head_dim, dtype, pages * 16, block_rows, stages, False) <= H100_SHARED_MEMORY
    if dtype == F32 and head_dim == 128:  # smaller key blocks, still pipelined
        assert choose_blocks(128, F32, 16, 16, False, H100_SHARED_MEMORY) == (4, 2)


def test_kernel_supports():
    for head_dim in (24, 80, 96, 112, 128, 192, 256):
        assert kernel_supports(head_dim, F32, 16, "gpu", shared_memory=H100_SHARED_MEMORY)
    assert padded_head_dim(24) == 32 and padded_head_dim(80) == 128 and padded_head_dim(8) == 16
    assert not kernel_supports(4096, F32, 16, "gpu", shared_memory=H100_SHARED_MEMORY)
    assert "4096" in unsupported_reason("gpu", 4096, F32, 16, shared_memory=H100_SHARED_MEMORY)
    assert not kernel_supports(128, F32, 12, "gpu")
    assert kernel_supports(128, BF16, 16, "tpu") and not kernel_supports(80, BF16, 16, "tpu")


def _inputs(head_dim: int, dtype, query_lens=None, max_q=1):
    key = jax.random.key(zlib.crc32(repr((head_dim, dtype, query_lens)).encode()))
    return make_inputs(
        key, lengths=[5, 40, 48], query_lens=query_lens, max_q=max_q, num_q_heads=4,
        num_kv_heads=2, head_dim=head_dim, page_size=16, pages_per_seq=3, dtype=dtype,
    )


@pytest.mark.parametrize("head_dim,dtype", [(24, F32), (80, BF16), (96, F32)])
def test_odd_head_dim_decode(head_dim, dtype):
    inputs = _inputs(head_dim, dtype)
    out = paged_attention_gpu(*inputs.decode_args, num_splits=2, interpret=True)
    assert out.shape[-1] == head_dim
    assert_close(out, paged_attention_reference(*inputs.decode_args), dtype)


@pytest.mark.parametrize("head_dim", [24, 96])
def test_odd_head_dim_ragged(head_dim):
    inputs = _inputs(head_dim, F32, query_lens=[3, 2, 3], max_q=3)
    out = ragged_paged_attention_gpu(*inputs.ragged_args, num_splits=1, interpret=True)
    assert_close(out, ragged_paged_attention_reference(*inputs.ragged_args), F32)
