"""The KV-cache write and decode-attention CPU kernels against plain jnp/numpy on fresh random inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from python_subprocess import needs_compiler, on_cpu_backend

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.contiguous import scatter_positions
from jaxinfer.cache.paged import init_page_pool
from jaxinfer.kernels.cpu import (
    decode_attention,
    decode_attention_applies,
    kernels_available,
    paged_decode_attention,
    write_positions,
)
from jaxinfer.kernels.cpu.decode_attention import PAGED_TARGET
from jaxinfer.models.attention import causal_window_mask, dense_attention, gathered_rows_attend
from jaxinfer.models.registry import from_hf_config
from pallas_kernels import quantize_kv

pytestmark = [on_cpu_backend, needs_compiler]


@pytest.fixture(scope="module", autouse=True)
def kernel_built() -> None:
    assert kernels_available(), "the CPU kernels did not build (see the log)"


def expected_cache(cache: np.ndarray, updates: np.ndarray, positions: np.ndarray, transposed: bool) -> np.ndarray:
    """The written cache, one entry at a time; positions outside [0, S) are skipped."""
    out = cache.copy()
    seq = cache.shape[3] if transposed else cache.shape[2]
    for b, t in np.ndindex(positions.shape):
        p = positions[b, t]
        if 0 <= p < seq:
            if transposed:
                out[b, :, :, p] = updates[b, t]
            else:
                out[b, :, p, :] = updates[b, t]
    return out


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("batch,steps", [(1, 1), (3, 5)])
@pytest.mark.parametrize("write", [write_positions, scatter_positions], ids=["kernel", "scatter"])
def test_cache_write_stores_in_range_positions(dtype, transposed: bool, batch: int, steps: int, write) -> None:
    rng = np.random.default_rng(batch * 31 + steps)
    kv, seq, dim = 2, 12, 8
    shape = (batch, kv, dim, seq) if transposed else (batch, kv, seq, dim)
    cache = np.asarray(jnp.asarray(rng.standard_normal(shape), dtype))
    updates = np.asarray(jnp.asarray(rng.standard_normal((batch, steps, kv, dim)), dtype))
    # Consecutive runs from random starts, some running off either end of the cache.
    starts = rng.integers(-2, seq, size=(batch, 1))
    positions = (starts + np.arange(steps)[None, :]).astype(np.int32)
    positions[0, 0] = seq + 3 if steps > 1 else positions[0, 0]
    got = jax.jit(write, static_argnames="transposed")(
        jnp.asarray(cache), jnp.asarray(updates), jnp.asarray(positions), transposed=transposed
    )
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got), expected_cache(cache, updates, positions, transposed))


def test_cache_write_inside_decode_loop_keeps_earlier_entries() -> None:
    """Donated into a while loop and read back each step, as the decode loop uses it."""
    cache = jnp.zeros((2, 1, 6, 3), jnp.bfloat16)

    def body(i: jax.Array, c: jax.Array) -> jax.Array:
        value = jnp.full((2, 1, 1, 3), i + 1, jnp.bfloat16)
        c = write_positions(c, value, jnp.full((2, 1), i, jnp.int32), transposed=False)
        return c + 0 * jnp.sum(c[:, :, :1])  # a read after the write, like attention's

    got = jax.jit(lambda c: jax.lax.fori_loop(0, 6, body, c), donate_argnums=0)(cache)
    expected = np.broadcast_to(np.arange(1, 7, dtype=np.float32)[None, None, :, None], (2, 1, 6, 3))
    np.testing.assert_array_equal(np.asarray(got, np.float32), expected)


# (batch, queries, heads, kv heads, cache length, head dim, sliding window)
ATTENTION_SHAPES = [
    (1, 1, 4, 2, 16, 8, 0),
    (3, 5, 6, 2, 40, 16, 0),
    (2, 3, 4, 4, 33, 64, 7),
    (2, 1, 9, 3, 256, 64, 0),
    (1, 16, 2, 1, 24, 32, 0),
]


@pytest.mark.parametrize("dtype,atol", [(jnp.float32, 2e-6), (jnp.bfloat16, 2e-2), (jnp.float16, 2e-3)])
@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=str)
def test_decode_attention_matches_dense_attention(dtype, atol: float, shape: tuple) -> None:
    """Against the jnp path on the same cache (which rounds probabilities to the cache dtype)."""
    batch, steps, heads, kv, seq, dim, window = shape
    rng = np.random.default_rng(sum(shape))
    q = jnp.asarray(rng.standard_normal((batch, steps, heads, dim)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((batch, kv, seq, dim)), dtype)
    v = jnp.asarray(rng.standard_normal((batch, kv, dim, seq)), dtype)
    starts = rng.integers(0, seq - steps + 1, size=(batch, 1))
    positions = jnp.asarray(starts + np.arange(steps)[None, :], jnp.int32)
    expected = dense_attention(q, k, v, causal_window_mask(positions, seq, window))
    got = jax.jit(decode_attention, static_argnames="window")(q, k, v, positions, window=window)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=atol, rtol=0)


def test_decode_attention_ignores_keys_past_each_query() -> None:
    """Garbage beyond a query's position (stale speculative entries) must not change its output."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, 2, 2, 8)), jnp.float32)
    k = rng.standard_normal((1, 1, 10, 8)).astype(np.float32)
    v = rng.standard_normal((1, 1, 8, 10)).astype(np.float32)
    positions = jnp.asarray([[4, 5]], jnp.int32)
    clean = decode_attention(q, jnp.asarray(k), jnp.asarray(v), positions, window=0)
    k[:, :, 6:], v[:, :, :, 6:] = 1e4, -1e4
    dirty = decode_attention(q, jnp.asarray(k), jnp.asarray(v), positions, window=0)
    np.testing.assert_array_equal(np.asarray(clean), np.asarray(dirty))


# (batch, queries, heads, kv heads, page size, pages per row, head dim, sliding window)
PAGED_SHAPES = [
    (3, 1, 4, 2, 16, 5, 64, 0),
    (2, 4, 6, 2, 8, 6, 40, 0),
    (4, 1, 8, 1, 4, 9, 72, 11),
    (2, 16, 2, 2, 32, 2, 128, 0),
    (5, 3, 9, 3, 16, 4, 16, 5),
]


def gathered(pools: np.ndarray, table: np.ndarray) -> np.ndarray:
    """[KV, P, page, D] pools through table [B, W] -> each row's cache [B, KV, W * page, D]."""
    kv, _, page, dim = pools.shape
    rows = pools[:, table]  # [KV, B, W, page, D]
    return rows.reshape(kv, table.shape[0], -1, dim).swapaxes(0, 1)


@pytest.mark.parametrize("dtype,atol", [(jnp.float32, 2e-6), (jnp.bfloat16, 2e-2), (jnp.float16, 2e-3)])
@pytest.mark.parametrize("shape", PAGED_SHAPES, ids=str)
def test_paged_decode_attention_matches_dense_attention(dtype, atol: float, shape: tuple) -> None:
    """Shuffled pages, rows of different lengths ending anywhere in a page, a padding row last."""
    batch, steps, heads, kv, page, width, dim, window = shape
    rng = np.random.default_rng(sum(shape))
    num_pages = batch * width + 3
    k_pool = rng.standard_normal((kv, num_pages, page, dim)).astype(np.float32)
    v_pool = rng.standard_normal((kv, num_pages, page, dim)).astype(np.float32)
    table = rng.permutation(num_pages)[: batch * width].reshape(batch, width).astype(np.int32)
    seq = width * page
    ends = rng.integers(steps - 1, seq, size=(batch, 1))
    positions = jnp.asarray(ends - steps + 1 + np.arange(steps)[None, :], jnp.int32)
    q = jnp.asarray(rng.standard_normal((batch, steps, heads, dim)), jnp.float32)
    keys = jnp.asarray(gathered(k_pool, table), dtype)
    values = jnp.asarray(gathered(v_pool, table).swapaxes(2, 3), dtype)
    positions = positions.at[-1].set(-1)  # a padding row: it sees no key and reads zeros
    expected = dense_attention(q, keys, values, causal_window_mask(positions, seq, window)).at[-1].set(0)
    pools = (jnp.asarray(k_pool, dtype), jnp.asarray(v_pool, dtype))
    attend = jax.jit(paged_decode_attention, static_argnames=("window", "value_dtype"))
    got = attend(q, *pools, jnp.asarray(table), positions, window=window, value_dtype=dtype)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=atol, rtol=0)


@pytest.mark.parametrize("shape", PAGED_SHAPES, ids=str)
def test_paged_decode_attention_reads_int8_pages_with_their_scales(shape: tuple) -> None:
    """int8 pools and per-token scales against dense float32 attention over the dequantized cache."""
    batch, steps, heads, kv, page, width, dim, window = shape
    rng = np.random.default_rng(sum(shape) + 1)
    num_pages = batch * width + 3
    scale_by_token = rng.uniform(0.1, 10.0, (kv, num_pages, page, 1))  # tokens of very different sizes
    (k_pool, k_scales), (v_pool, v_scales) = (
        quantize_kv(jnp.asarray(rng.standard_normal((kv, num_pages, page, dim)) * scale_by_token, jnp.float32))
        for _ in range(2)
    )
    table = rng.permutation(num_pages)[: batch * width].reshape(batch, width).astype(np.int32)
    seq = width * page
    ends = rng.integers(steps - 1, seq, size=(batch, 1))
    positions = jnp.asarray(ends - steps + 1 + np.arange(steps)[None, :], jnp.int32).at[-1].set(-1)
    q = jnp.asarray(rng.standard_normal((batch, steps, heads, dim)), jnp.float32)
    k_dense = np.asarray(k_pool, np.float32) * np.asarray(k_scales)[..., None]
    v_dense = np.asarray(v_pool, np.float32) * np.asarray(v_scales)[..., None]
    keys = jnp.asarray(gathered(k_dense, table))
    values = jnp.asarray(gathered(v_dense, table).swapaxes(2, 3))
    expected = dense_attention(q, keys, values, causal_window_mask(positions, seq, window)).at[-1].set(0)
    attend = jax.jit(paged_decode_attention, static_argnames=("window", "value_dtype"))
    got = attend(q, k_pool, v_pool, jnp.asarray(table), positions, window=window, value_dtype=jnp.int8,
                 k_scales=k_scales, v_scales=v_scales)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_decode_attention_within_attention_chunks(paged: bool) -> None:
    """Llama 4's chunks of 5 positions: 4 queries a row crossing a chunk boundary see their own chunk's keys
    only, as the jnp mask has it (which differs from causal attention there); a padding row reads zeros."""
    batch, steps, heads, kv, page, width, dim, chunk = 3, 4, 4, 2, 8, 4, 32, 5
    rng = np.random.default_rng(chunk)
    k_pool, v_pool = (rng.standard_normal((kv, batch * width, page, dim)).astype(np.float32) for _ in range(2))
    table = rng.permutation(batch * width).reshape(batch, width).astype(np.int32)
    seq = width * page
    positions = jnp.asarray([[8, 9, 10, 11], [18, 19, 20, 21], [-1] * steps], jnp.int32)
    q = jnp.asarray(rng.standard_normal((batch, steps, heads, dim)), jnp.float32)
    keys, values = jnp.asarray(gathered(k_pool, table)), jnp.asarray(gathered(v_pool, table).swapaxes(2, 3))
    expected = dense_attention(q, keys, values, causal_window_mask(positions, seq, 0, chunk)).at[-1].set(0)
    causal = dense_attention(q, keys, values, causal_window_mask(positions, seq, 0)).at[-1].set(0)
    if paged:
        got = paged_decode_attention(q, jnp.asarray(k_pool), jnp.asarray(v_pool), jnp.asarray(table), positions, 0,
                                     jnp.float32, chunk=chunk)
    else:
        got = decode_attention(q, keys, values, positions, 0, chunk=chunk)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=2e-6, rtol=0)
    assert not np.allclose(np.asarray(expected), np.asarray(causal), atol=1e-3)


def test_paged_decode_attention_wants_scales_exactly_for_int8() -> None:
    pools = jnp.zeros((1, 2, 4, 16), jnp.int8)
    args = (jnp.zeros((1, 1, 1, 16)), pools, pools, jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 1), jnp.int32), 0)
    with pytest.raises(ValueError, match="int8 pools need k_scales and v_scales"):
        paged_decode_attention(*args, jnp.int8)


@pytest.mark.parametrize("kv_dtype,native", [("auto", True), ("int8", True), ("fp8", False)])
def test_engine_pools_route_int8_to_the_kernel_and_fp8_to_xla(kv_dtype: str, native: bool) -> None:
    """Decode rows of the engine's pools: bf16 and int8 pages are read in place by the kernel."""
    cfg = from_hf_config(dict(architectures=["LlamaForCausalLM"], vocab_size=16, hidden_size=128,
                              intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                              num_key_value_heads=2))
    pool = init_page_pool(cfg, 8, 16, jnp.bfloat16, kv_dtype, cpu_kernels=True)
    table, lengths, query_lens = jnp.zeros((2, 4), jnp.int32), jnp.array([5, 9]), jnp.array([1, 1])
    q = jnp.zeros((2, 1, 4, cfg.head_dim), jnp.bfloat16)
    run = lambda q, pool: gathered_rows_attend(q, pool, 0, 0, lengths, table, query_lens)  # noqa: E731
    hlo = jax.jit(run).lower(q, pool).as_text()
    assert (PAGED_TARGET in hlo) == native


def test_decode_attention_only_for_a_few_queries() -> None:
    assert decode_attention_applies(16, jnp.bfloat16)
    assert not decode_attention_applies(17, jnp.bfloat16)
    assert not decode_attention_applies(1, jnp.int8)


def test_generation_same_with_kernels_off() -> None:
    """Greedy decode of the demo model, kernels on and off in one process: the choice is per LLM."""
    params = SamplingParams(max_tokens=24, temperature=0.0)
    runs = {}
    for kernels in (True, False):
        llm = LLM(dtype="float32", max_seq_len=128, cpu_kernels=kernels)
        assert llm.cpu_kernels is kernels
        runs[kernels] = [o.token_ids for o in llm.generate(["def main(", "import os\n"], params)]
    assert runs[True] == runs[False]


def lowered_logits(llm: LLM) -> str:
    """StableHLO of the LLM's logits program over 16 tokens (few enough for decode attention)."""
    from jaxinfer.cache.contiguous import init_cache
    from jaxinfer.runtime import step_programs

    cache = init_cache(llm.config, 1, 16, llm.dtype, llm.cpu_kernels)
    tokens = jnp.zeros((1, 16), jnp.int32)
    return step_programs.all_logits.lower(llm._run_weights, tokens, cache, cfg=llm.config).as_text()


def test_choice_decides_what_is_compiled() -> None:
    """On: all three kernels are in the program; off: none is, the XLA code accelerators compile."""
    targets = ("jaxinfer_packed_matmul", "jaxinfer_cache_write", "jaxinfer_decode_attention")
    on = lowered_logits(LLM(dtype="bfloat16", max_seq_len=64, cpu_kernels=True))
    off = lowered_logits(LLM(dtype="bfloat16", max_seq_len=64, cpu_kernels=False))
    assert all(t in on for t in targets)
    assert not any(t in off for t in targets)
