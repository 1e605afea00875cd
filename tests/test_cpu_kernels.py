"""The KV-cache write and decode-attention CPU kernels against plain jnp/numpy on fresh random inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.attention import causal_window_mask, dense_attention
from jaxinfer import LLM, SamplingParams
from jaxinfer.cpu_kernels import (
    decode_attention,
    decode_attention_applies,
    kernels_available,
    paged_decode_attention,
    write_positions,
)
from jaxinfer.kv_cache import scatter_positions
from python_subprocess import needs_compiler, on_cpu_backend

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
    from jaxinfer import steps
    from jaxinfer.kv_cache import init_cache

    cache = init_cache(llm.config, 1, 16, llm.dtype, llm.cpu_kernels)
    tokens = jnp.zeros((1, 16), jnp.int32)
    return steps.all_logits.lower(llm._run_weights, tokens, cache, cfg=llm.config).as_text()


def test_choice_decides_what_is_compiled() -> None:
    """On: all three kernels are in the program; off: none is, the XLA code accelerators compile."""
    targets = ("jaxinfer_packed_matmul", "jaxinfer_cache_write", "jaxinfer_decode_attention")
    on = lowered_logits(LLM(dtype="bfloat16", max_seq_len=64, cpu_kernels=True))
    off = lowered_logits(LLM(dtype="bfloat16", max_seq_len=64, cpu_kernels=False))
    assert all(t in on for t in targets)
    assert not any(t in off for t in targets)
