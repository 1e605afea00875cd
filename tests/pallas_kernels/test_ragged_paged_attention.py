"""Ragged multi-query paged attention (speculative verify, chunked prefill) vs the reference."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from paged_kernel_inputs import (
    H100_SHARED_MEMORY,
    PagedInputs,
    assert_close,
    kernel_blocks,
    lower_for,
    make_inputs,
    require_device,
    triton_shared_memory,
)

from pallas_kernels import (
    paged_attention_reference,
    ragged_paged_attention,
    ragged_paged_attention_gpu,
    ragged_paged_attention_reference,
    ragged_paged_attention_tpu,
)
from pallas_kernels.gpu_blocks import MAX_BLOCK_ROWS

F32, BF16 = jnp.float32, jnp.bfloat16


def _key(*parts) -> jax.Array:
    """A fresh PRNG key per test case, stable across runs."""
    return jax.random.key(zlib.crc32(repr(parts).encode()))


# name: (dtype, q heads, kv heads, head_dim, page_size, pages_per_seq, max_q,
#        lengths, query_lens, block_rows, splits)
CASES = {
    "verify_mha": (F32, 4, 4, 64, 16, 4, 4, [4, 50, 64], [1, 4, 3], None, 1),
    "verify_gqa4_split": (BF16, 8, 2, 128, 16, 4, 5, [5, 33, 64], [5, 2, 5], None, 2),
    "prefill_gqa8_row_blocks": (F32, 16, 2, 64, 32, 3, 6, [6, 70, 96], [6, 6, 1], 16, 1),
    "chunk_gqa4_idle_slot": (BF16, 8, 2, 64, 32, 4, 8, [8, 100, 10], [8, 8, 0], 16, 3),
    "prefill_whole_sequence": (F32, 8, 8, 128, 16, 2, 32, [32, 20], [32, 20], None, 1),
}

# name: (dtype, int8, soft_cap, sliding_window, splits)
FEATURES = {
    "int8": (F32, True, None, None, 1),
    "int8_bf16_split": (BF16, True, None, None, 2),
    "soft_cap": (F32, False, 25.0, None, 2),
    "window_shorter_than_queries": (F32, False, None, 3, 1),
    "window_across_pages": (BF16, True, 30.0, 20, 2),
}


def _case_inputs(name: str, out_of_range_entries: bool = False) -> PagedInputs:
    dtype, q_heads, kv_heads, head_dim, ps, pps, max_q, lengths, query_lens, _, _ = CASES[name]
    return make_inputs(
        _key("case", name), lengths=lengths, query_lens=query_lens, max_q=max_q,
        num_q_heads=q_heads, num_kv_heads=kv_heads, head_dim=head_dim, page_size=ps,
        pages_per_seq=pps, dtype=dtype, out_of_range_entries=out_of_range_entries,
    )


def _feature_inputs(name: str, out_of_range_entries: bool = False) -> PagedInputs:
    dtype, int8, _, window, _ = FEATURES[name]
    return make_inputs(
        _key("feature", name), lengths=[6, 40, 64], query_lens=[6, 4, 1], max_q=6,
        num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=16, pages_per_seq=4,
        dtype=dtype, int8=int8, sliding_window=window,
        out_of_range_entries=out_of_range_entries,
    )


def _assert_padding_rows_zero(out: jax.Array, query_lens: jax.Array) -> None:
    """Rows i >= query_lens[b] are exactly zero, as the spec says."""
    padding = np.arange(out.shape[1])[None, :] >= np.asarray(query_lens)[:, None]
    padded_rows = np.asarray(out, np.float32)[padding]
    assert np.array_equal(padded_rows, np.zeros_like(padded_rows))


@pytest.mark.parametrize("name", list(CASES))
def test_gpu_kernel_cases(name):
    inputs = _case_inputs(name)
    *_, block_rows, splits = CASES[name]
    out = ragged_paged_attention_gpu(
        *inputs.ragged_args, block_rows=block_rows, num_splits=splits, pages_per_block=2,
        interpret=True,
    )
    assert_close(out, ragged_paged_attention_reference(*inputs.ragged_args), CASES[name][0])
    _assert_padding_rows_zero(out, inputs.query_lens)


@pytest.mark.parametrize("name", list(FEATURES))
def test_gpu_kernel_features(name):
    dtype, _, soft_cap, window, splits = FEATURES[name]
    inputs = _feature_inputs(name)
    opts = dict(soft_cap=soft_cap, sliding_window=window, **inputs.kwargs)
    out = ragged_paged_attention_gpu(
        *inputs.ragged_args, num_splits=splits, pages_per_block=1, interpret=True, **opts
    )
    assert_close(out, ragged_paged_attention_reference(*inputs.ragged_args, **opts), dtype)
    _assert_padding_rows_zero(out, inputs.query_lens)


@pytest.mark.parametrize("name", ["prefill_gqa8_row_blocks", "chunk_gqa4_idle_slot"])
def test_tpu_kernel_cases(name):
    inputs = _case_inputs(name, out_of_range_entries=True)
    with jax.default_device(jax.devices("cpu")[0]):
        out = ragged_paged_attention_tpu(
            *inputs.ragged_args, block_rows=CASES[name][9], pages_per_block=2, interpret=True
        )
    assert_close(out, ragged_paged_attention_reference(*inputs.ragged_args), CASES[name][0])
    _assert_padding_rows_zero(out, inputs.query_lens)


def test_tpu_kernel_features():
    inputs = _feature_inputs("window_across_pages", out_of_range_entries=True)
    opts = dict(soft_cap=30.0, sliding_window=20, **inputs.kwargs)
    with jax.default_device(jax.devices("cpu")[0]):
        out = ragged_paged_attention_tpu(*inputs.ragged_args, pages_per_block=1, interpret=True, **opts)
    assert_close(out, ragged_paged_attention_reference(*inputs.ragged_args, **opts), BF16)
    _assert_padding_rows_zero(out, inputs.query_lens)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_kernels_take_attention_chunks(platform):
    """Llama 4's chunks of 3 positions (queries of one row cross several; pages of 16, blocks of 1 page):
    both kernels, interpreted, equal the reference, whose chunk mask is written apart (key // chunk ==
    query // chunk); the chunked result differs from plain causal attention."""
    inputs = _feature_inputs("soft_cap", out_of_range_entries=platform == "tpu")
    opts = dict(attention_chunk=3, **inputs.kwargs)
    kernel = ragged_paged_attention_gpu if platform == "gpu" else ragged_paged_attention_tpu
    with jax.default_device(jax.devices("cpu")[0]):
        out = kernel(*inputs.ragged_args, pages_per_block=1, interpret=True, **opts)
    expected = ragged_paged_attention_reference(*inputs.ragged_args, **opts)
    assert_close(out, expected, F32)
    assert not np.allclose(np.asarray(expected), np.asarray(ragged_paged_attention_reference(*inputs.ragged_args)))
    _assert_padding_rows_zero(out, inputs.query_lens)


# BLOOM's slopes for 8 heads (2^-1 .. 2^-8), the first heads' steep enough that far keys barely count.
SLOPES = 2.0 ** -jnp.arange(1, 9, dtype=jnp.float32)


@pytest.mark.parametrize("platform,int8", [("gpu", False), ("tpu", True)])
def test_kernels_take_alibi_slopes(platform, int8):
    """ALiBi (BLOOM, MPT): both kernels, interpreted (the GPU one over 2 splits, so the bias survives the combine),
    equal the reference on rows whose queries sit at different offsets, float and int8 pages; the slopes change
    the result, and reversed slopes change it again (each head reads its own slope)."""
    name = "int8" if int8 else "soft_cap"
    inputs = _feature_inputs(name, out_of_range_entries=platform == "tpu")
    opts = dict(alibi_slopes=SLOPES, **inputs.kwargs)
    with jax.default_device(jax.devices("cpu")[0]):
        if platform == "gpu":
            out = ragged_paged_attention_gpu(*inputs.ragged_args, pages_per_block=1, num_splits=2, interpret=True,
                                             **opts)
        else:
            out = ragged_paged_attention_tpu(*inputs.ragged_args, pages_per_block=1, interpret=True, **opts)
    expected = ragged_paged_attention_reference(*inputs.ragged_args, **opts)
    assert_close(out, expected, F32)
    _assert_padding_rows_zero(out, inputs.query_lens)
    if platform == "gpu":
        plain = ragged_paged_attention_reference(*inputs.ragged_args, **inputs.kwargs)
        reversed_slopes = ragged_paged_attention_reference(*inputs.ragged_args, alibi_slopes=SLOPES[::-1])
        assert not np.allclose(np.asarray(expected), np.asarray(plain), atol=1e-3)
        assert not np.allclose(np.asarray(expected), np.asarray(reversed_slopes), atol=1e-3)


def test_alibi_kernels_lower_for_real_hardware():
    """With ALiBi slopes the Triton and Mosaic kernels still lower for CUDA and TPU."""
    inputs = _case_inputs("verify_gqa4_split")
    gpu = lambda *args: ragged_paged_attention_gpu(*args, alibi_slopes=SLOPES)  # noqa: E731
    tpu = lambda *args: ragged_paged_attention_tpu(*args, alibi_slopes=SLOPES)  # noqa: E731
    assert "xla.gpu.triton" in lower_for("cuda", gpu, *inputs.ragged_args)
    assert "tpu_custom_call" in lower_for("tpu", tpu, *inputs.ragged_args)


def test_chunked_kernels_lower_for_real_hardware():
    """With an attention chunk the Triton and Mosaic kernels still lower for CUDA and TPU."""
    inputs = _case_inputs("verify_gqa4_split")
    gpu = lambda *args: ragged_paged_attention_gpu(*args, attention_chunk=8)  # noqa: E731
    tpu = lambda *args: ragged_paged_attention_tpu(*args, attention_chunk=8)  # noqa: E731
    assert "xla.gpu.triton" in lower_for("cuda", gpu, *inputs.ragged_args)
    assert "tpu_custom_call" in lower_for("tpu", tpu, *inputs.ragged_args)


def test_reference_matches_decode_per_query():
    """Query i of a ragged batch is decode attention at length L - query_len + i + 1."""
    inputs = _feature_inputs("window_shorter_than_queries")
    out = ragged_paged_attention_reference(*inputs.ragged_args, sliding_window=3)
    for i in range(inputs.q.shape[1]):
        valid = np.asarray(i < inputs.query_lens)
        lengths = jnp.maximum(inputs.lengths - inputs.query_lens + i + 1, 1)
        q = jnp.where(valid[:, None, None], inputs.q[:, i], 0.0)
        decode = paged_attention_reference(
            q, inputs.k_pages, inputs.v_pages, lengths, inputs.page_indices, sliding_window=3
        )
        np.testing.assert_allclose(np.asarray(out[valid, i]), np.asarray(decode[valid]), atol=1e-5)


def test_dispatch_paths_agree():
    inputs = _case_inputs("verify_gqa4_split")
    expected = ragged_paged_attention_reference(*inputs.ragged_args)
    assert_close(ragged_paged_attention(*inputs.ragged_args, backend="cpu"), expected, BF16)
    assert_close(ragged_paged_attention(*inputs.ragged_args, backend="cpu", interpret=True), expected, BF16)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_kernels_lower_for_real_hardware(dtype):
    """At the product's shapes and the largest row block, the Triton kernel's traced blocks fit an
    H100's shared memory and its lowering carries those settings; the Mosaic kernel's VMEM page
    blocks keep the cache dtype."""
    inputs = _device_inputs(dtype, False)
    gpu = lambda *args: ragged_paged_attention_gpu(*args, num_splits=2, block_rows=MAX_BLOCK_ROWS)  # noqa: E731
    blocks = kernel_blocks(gpu, *inputs.ragged_args)
    assert triton_shared_memory(blocks) <= H100_SHARED_MEMORY
    lowered = lower_for("cuda", gpu, *inputs.ragged_args)
    assert "xla.gpu.triton" in lowered and f"num_stages = {blocks.compiler_params.num_stages}" in lowered
    tpu = lambda *args: ragged_paged_attention_tpu(*args, block_rows=16)  # noqa: E731
    vmem = [a for a in kernel_blocks(tpu, *inputs.ragged_args).scratch if len(getattr(a, "shape", ())) == 4]
    assert vmem and all(a.dtype == dtype for a in vmem)
    assert "tpu_custom_call" in lower_for("tpu", tpu, *inputs.ragged_args)


def _device_inputs(dtype, int8: bool) -> PagedInputs:
    lengths = [7, 300, 2048, 1000, 64, 1777]
    return make_inputs(
        _key("device", dtype, int8), lengths=lengths, query_lens=[7, 5, 8, 1, 64, 0],
        max_q=64, num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=16,
        pages_per_seq=128, dtype=dtype, int8=int8,
    )


@pytest.mark.parametrize("dtype,int8", [(BF16, False), (F32, False), (BF16, True)], ids=str)
def test_gpu_compiled(dtype, int8):
    require_device("gpu")
    inputs = _device_inputs(dtype, int8)
    for opts in (dict(), dict(soft_cap=30.0, sliding_window=100)):
        out = ragged_paged_attention_gpu(*inputs.ragged_args, **opts, **inputs.kwargs)
        expected = ragged_paged_attention_reference(*inputs.ragged_args, **opts, **inputs.kwargs)
        assert_close(out, expected, dtype)
        _assert_padding_rows_zero(out, inputs.query_lens)


def test_tpu_compiled():
    require_device("tpu")
    inputs = _device_inputs(BF16, False)
    out = ragged_paged_attention_tpu(*inputs.ragged_args)
    assert_close(out, ragged_paged_attention_reference(*inputs.ragged_args), BF16)
