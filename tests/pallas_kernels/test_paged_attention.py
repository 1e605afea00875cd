"""Decode paged attention: Triton and Mosaic kernels (interpret mode on CPU) vs the reference."""

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
    choose_implementation,
    dequantize_kv,
    paged_attention,
    paged_attention_gpu,
    paged_attention_reference,
    paged_attention_tpu,
    quantize_kv,
    ragged_paged_attention_reference,
)

F32, BF16 = jnp.float32, jnp.bfloat16

# (dtype, q heads, kv heads, head_dim, page_size, pages_per_seq, pages_per_block, splits)
SHAPES = [
    (F32, 4, 4, 64, 16, 6, 2, 1),  # MHA, several blocks
    (BF16, 8, 2, 128, 16, 8, 8, 1),  # GQA 4, one block holds the whole table
    (F32, 16, 2, 64, 32, 4, 1, 2),  # GQA 8, one page per block, split-K
    (BF16, 8, 8, 128, 32, 4, 1, 3),  # MHA, three splits over uneven blocks
    (BF16, 8, 1, 64, 32, 5, 2, 2),  # GQA 8 on a single kv head
    (F32, 8, 2, 128, 16, 7, 4, 1),  # GQA 4, last block partly past the table
]

# (dtype, int8, soft_cap, sliding_window, splits)
FEATURES = [
    (F32, True, None, None, 1),
    (BF16, True, None, None, 2),
    (F32, False, 30.0, None, 1),
    (BF16, False, None, 5, 1),  # window inside one page
    (F32, False, None, 40, 2),  # window across pages; early pages poisoned
    (BF16, True, 20.0, 24, 2),
]


def _key(*parts) -> jax.Array:
    """A fresh PRNG key per test case, stable across runs."""
    return jax.random.key(zlib.crc32(repr(parts).encode()))


def _lengths(page_size: int, pages_per_seq: int) -> list[int]:
    """One token, a partly filled last page, and a completely full table."""
    return [1, page_size * (pages_per_seq // 2) + 3, page_size * pages_per_seq]


def _shape_inputs(case: tuple) -> PagedInputs:
    dtype, q_heads, kv_heads, head_dim, page_size, pps, _, _ = case
    return make_inputs(
        _key("shape", case), lengths=_lengths(page_size, pps), num_q_heads=q_heads,
        num_kv_heads=kv_heads, head_dim=head_dim, page_size=page_size, pages_per_seq=pps,
        dtype=dtype,
    )


def _feature_inputs(case: tuple, out_of_range_entries: bool = False) -> PagedInputs:
    dtype, int8, _, window, _ = case
    return make_inputs(
        _key("feature", case), lengths=[1, 45, 64], num_q_heads=8, num_kv_heads=2,
        head_dim=64, page_size=16, pages_per_seq=4, dtype=dtype, int8=int8,
        sliding_window=window, out_of_range_entries=out_of_range_entries,
    )


@pytest.mark.parametrize("case", SHAPES, ids=str)
def test_gpu_kernel_shapes(case):
    inputs = _shape_inputs(case)
    *_, ppb, splits = case
    out = paged_attention_gpu(
        *inputs.decode_args, pages_per_block=ppb, num_splits=splits, interpret=True
    )
    assert_close(out, paged_attention_reference(*inputs.decode_args), case[0])


@pytest.mark.parametrize("case", FEATURES, ids=str)
def test_gpu_kernel_features(case):
    dtype, _, soft_cap, window, splits = case
    inputs = _feature_inputs(case)
    opts = dict(soft_cap=soft_cap, sliding_window=window, **inputs.kwargs)
    out = paged_attention_gpu(
        *inputs.decode_args, pages_per_block=1, num_splits=splits, interpret=True, **opts
    )
    assert_close(out, paged_attention_reference(*inputs.decode_args, **opts), dtype)


TPU_SHAPES = [SHAPES[0], SHAPES[1], SHAPES[3]]
TPU_FEATURES = [FEATURES[1], FEATURES[4], FEATURES[5]]


@pytest.mark.parametrize("case", TPU_SHAPES, ids=str)
def test_tpu_kernel_shapes(case):
    inputs = _shape_inputs(case)
    with jax.default_device(jax.devices("cpu")[0]):
        out = paged_attention_tpu(*inputs.decode_args, pages_per_block=case[6], interpret=True)
    assert_close(out, paged_attention_reference(*inputs.decode_args), case[0])


@pytest.mark.parametrize("case", TPU_FEATURES, ids=str)
def test_tpu_kernel_features(case):
    dtype, _, soft_cap, window, _ = case
    inputs = _feature_inputs(case, out_of_range_entries=True)
    opts = dict(soft_cap=soft_cap, sliding_window=window, **inputs.kwargs)
    with jax.default_device(jax.devices("cpu")[0]):
        out = paged_attention_tpu(*inputs.decode_args, pages_per_block=2, interpret=True, **opts)
    assert_close(out, paged_attention_reference(*inputs.decode_args, **opts), dtype)


def test_sm_scale_is_applied():
    inputs = _shape_inputs(SHAPES[0])
    out = paged_attention_gpu(*inputs.decode_args, sm_scale=0.3, num_splits=1, interpret=True)
    expected = paged_attention_reference(*inputs.decode_args, sm_scale=0.3)
    assert_close(out, expected, F32)
    assert not np.allclose(expected, paged_attention_reference(*inputs.decode_args), atol=1e-3)


def test_dispatch_picks_by_platform():
    assert choose_implementation("tpu", False) == "tpu"
    assert choose_implementation("gpu", True) == "gpu"
    assert choose_implementation("cpu", False) == "reference"
    assert choose_implementation("cpu", True) == "gpu"
    with pytest.raises(ValueError):
        choose_implementation("metal", False)


def test_dispatch_matches_reference_on_every_path():
    inputs = _feature_inputs(FEATURES[5])
    opts = dict(soft_cap=20.0, sliding_window=24, **inputs.kwargs)
    expected = paged_attention_reference(*inputs.decode_args, **opts)
    assert_close(paged_attention(*inputs.decode_args, backend="reference", **opts), expected, BF16)
    assert_close(paged_attention(*inputs.decode_args, backend="cpu", interpret=True, **opts), expected, BF16)


def test_quantize_kv_roundtrip():
    x = jax.random.normal(_key("quant"), (2, 3, 5, 64), jnp.float32)
    x = x.at[0, 0, 0].set(0.0)  # an all-zero token must not divide by zero
    values, scales = quantize_kv(x)
    assert values.dtype == jnp.int8 and scales.shape == x.shape[:-1]
    error = jnp.abs(dequantize_kv(values, scales) - x)
    assert bool(jnp.all(error <= scales[..., None] / 2 + 1e-6))


def test_reference_rejects_mismatched_heads():
    inputs = _shape_inputs(SHAPES[1])
    with pytest.raises(ValueError, match="divisible"):
        paged_attention_reference(inputs.q[:, 0, :3], *inputs.decode_args[1:])


def _product_inputs(dtype, int8: bool = False) -> PagedInputs:
    """The shapes the product runs: Llama-style 32 query / 8 KV heads, head_dim 128, 16-token pages."""
    return make_inputs(
        _key("product", dtype, int8), lengths=[5, 700, 2048], num_q_heads=32, num_kv_heads=8,
        head_dim=128, page_size=16, pages_per_seq=128, dtype=dtype, int8=int8,
    )


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_gpu_kernel_fits_h100_shared_memory(dtype):
    """The blocks the Triton kernel is traced with fit an H100's shared memory at the product's
    shapes (the float32 kernel once asked for 270336 bytes), and the lowering carries those settings."""
    inputs = _product_inputs(dtype)
    run = lambda *args: paged_attention_gpu(*args, num_splits=2)  # noqa: E731
    blocks = kernel_blocks(run, *inputs.decode_args)
    assert triton_shared_memory(blocks) <= H100_SHARED_MEMORY
    lowered = lower_for("cuda", run, *inputs.decode_args)
    assert "xla.gpu.triton" in lowered and 'name = "paged_attention_gpu"' in lowered
    assert f"num_stages = {blocks.compiler_params.num_stages}" in lowered
    sinks = jnp.zeros(inputs.decode_args[0].shape[1])  # unsplit with sinks: partial outputs, combined outside
    with_sinks = lower_for("cuda", lambda *args: paged_attention_gpu(*args, num_splits=1, sinks=sinks),
                           *inputs.decode_args)
    assert "xla.gpu.triton" in with_sinks


@pytest.mark.parametrize("int8", [False, True])
def test_tpu_kernel_streams_lane_wide_pages_in_their_dtype(int8):
    """The Mosaic kernel double-buffers 128 keys of pages per block in VMEM, in the cache's own
    dtype (bf16 or int8 with float32 scales, never widened), and lowers to a Mosaic call."""
    inputs = _product_inputs(BF16, int8)
    run = lambda *args: paged_attention_tpu(*args, **inputs.kwargs)  # noqa: E731
    blocks = kernel_blocks(run, *inputs.decode_args)
    page_dtype = jnp.int8 if int8 else BF16
    vmem = [a for a in blocks.scratch if getattr(a, "shape", ())[:1] == (2,) and len(a.shape) == 4]
    assert [(a.dtype, a.shape[0], a.shape[1] * a.shape[2], a.shape[3]) for a in vmem] == [(page_dtype, 2, 128, 128)] * 2
    scales = [a for a in blocks.scratch if len(getattr(a, "shape", ())) == 3]
    assert [a.dtype for a in scales] == ([jnp.float32] * 2 if int8 else [])
    lowered = lower_for("tpu", run, *inputs.decode_args)
    assert "tpu_custom_call" in lowered and 'kernel_name = "paged_attention_tpu"' in lowered
    sinks = jnp.zeros(inputs.decode_args[0].shape[1])  # each row's sink read as a VMEM block beside its query
    with_sinks = lower_for("tpu", lambda *args: paged_attention_tpu(*args, sinks=sinks, **inputs.kwargs),
                           *inputs.decode_args)
    assert 'kernel_name = "paged_attention_tpu"' in with_sinks


def _device_case(dtype, int8: bool, seed: int) -> PagedInputs:
    lengths = [1, 17, 1000, 2048, 333, 2047, 64, 1500]
    return make_inputs(
        _key("device", dtype, int8, seed), lengths=lengths, num_q_heads=32, num_kv_heads=8,
        head_dim=128, page_size=16, pages_per_seq=128, dtype=dtype, int8=int8,
    )


# BLOOM's ALiBi slopes for the device cases' 32 heads: 2^(-8 i / 32), i = 1..32.
SLOPES_32 = 2.0 ** (-8.0 * jnp.arange(1, 33, dtype=jnp.float32) / 32)


@pytest.mark.parametrize("dtype,int8", [(BF16, False), (F32, False), (BF16, True)], ids=str)
def test_gpu_compiled(dtype, int8):
    require_device("gpu")
    inputs = _device_case(dtype, int8, 0)
    sinks = jnp.linspace(-2.0, 3.0, inputs.decode_args[0].shape[1])  # GPT-OSS's per-head sink logits
    for opts in (dict(), dict(soft_cap=30.0, sliding_window=300), dict(sinks=sinks), dict(alibi_slopes=SLOPES_32)):
        out = paged_attention_gpu(*inputs.decode_args, **opts, **inputs.kwargs)
        assert_close(out, paged_attention_reference(*inputs.decode_args, **opts, **inputs.kwargs), dtype)
        assert_close(paged_attention(*inputs.decode_args, **opts, **inputs.kwargs), out, dtype)


@pytest.mark.parametrize("dtype,int8", [(BF16, False), (BF16, True)], ids=str)
def test_tpu_compiled(dtype, int8):
    require_device("tpu")
    inputs = _device_case(dtype, int8, 1)
    out = paged_attention_tpu(*inputs.decode_args, **inputs.kwargs)
    assert_close(out, paged_attention_reference(*inputs.decode_args, **inputs.kwargs), dtype)
    sinks = jnp.linspace(-2.0, 3.0, inputs.decode_args[0].shape[1])  # GPT-OSS's per-head sink logits
    out = paged_attention_tpu(*inputs.decode_args, sinks=sinks, **inputs.kwargs)
    assert_close(out, paged_attention_reference(*inputs.decode_args, sinks=sinks, **inputs.kwargs), dtype)
    out = paged_attention_tpu(*inputs.decode_args, alibi_slopes=SLOPES_32, **inputs.kwargs)
    assert_close(out, paged_attention_reference(*inputs.decode_args, alibi_slopes=SLOPES_32, **inputs.kwargs), dtype)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_tokens_as_rows_equal_causal_attention(platform):
    """The engine's attention over a flat token stream: each token of a chunk is a row of the decode
    kernel (its sequence's page table, length = position + 1, tokens of one sequence sharing the
    table), and equals causal multi-query attention (the ragged reference) at that position."""
    lengths, chunk = [9, 40, 64], 8
    inputs = make_inputs(
        _key("tokens", platform), lengths=lengths, query_lens=[chunk] * 3, max_q=chunk, num_q_heads=8,
        num_kv_heads=2, head_dim=64, page_size=16, pages_per_seq=4, dtype=F32, out_of_range_entries=platform == "tpu",
    )
    causal = ragged_paged_attention_reference(*inputs.ragged_args)  # [3, chunk, H, D]
    rows = np.repeat(np.arange(3), chunk)
    positions = (np.asarray(lengths)[:, None] - chunk + np.arange(chunk)[None, :]).reshape(-1)
    args = (inputs.q.reshape(3 * chunk, *inputs.q.shape[2:]), inputs.k_pages, inputs.v_pages,
            jnp.asarray(positions + 1, jnp.int32), inputs.page_indices[rows])
    if platform == "gpu":
        out = paged_attention_gpu(*args, pages_per_block=2, num_splits=1, interpret=True)
    else:
        with jax.default_device(jax.devices("cpu")[0]):
            out = paged_attention_tpu(*args, pages_per_block=2, interpret=True)
    assert_close(out, causal.reshape(out.shape), F32)
