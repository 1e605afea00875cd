"""fp8 (e4m3) KV cache: quantized on write in both layouts, half the pool, demo-model agreement with bf16."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.contiguous import cache_bytes, init_cache
from jaxinfer.cache.paged import init_page_pool, init_paged_cache, page_bytes
from jaxinfer.kernels.cpu import kernels_available
from jaxinfer.models.attention import attend, kernel_backend
from jaxinfer.models.registry import from_hf_config
from jaxinfer.runtime import step_programs
from jaxinfer.runtime.cache_spec import CacheSpec

CFG = from_hf_config(dict(architectures=["LlamaForCausalLM"], vocab_size=16, hidden_size=256,
                          intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                          num_key_value_heads=2))
PROMPTS = ["def parse(line):\n", "for key, value in items:\n", "    return self._cache[name]\n"]


@jax.jit
def _attend(q: jax.Array, cache, positions: jax.Array) -> jax.Array:
    """Layer 0 attention, compiled whole (op-by-op dispatch compiles every primitive separately)."""
    return attend(q, cache, 0, positions, 0)


@jax.jit
def _write(cache, k: jax.Array, v: jax.Array, positions: jax.Array):
    """Layer 0 write, compiled whole."""
    return cache.write(0, k, v, positions)


def _random_qkv(batch: int, steps_: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    shape = (batch, steps_, CFG.num_kv_heads, CFG.head_dim)
    q = jax.random.normal(kq, (batch, steps_, CFG.num_heads, CFG.head_dim))
    return q, jax.random.normal(kk, shape), jax.random.normal(kv, shape)


def test_fp8_pool_is_about_half_of_bf16_and_stores_bits():
    bf16 = init_page_pool(CFG, 8, 16, jnp.bfloat16)
    fp8 = init_page_pool(CFG, 8, 16, jnp.bfloat16, "fp8")
    # Bits, not float8: XLA:CPU copies a whole float8 pool on every scatter (integers in place).
    assert fp8.k_pages[0].dtype == jnp.uint8 and fp8.value_dtype == jnp.float8_e4m3fn and fp8.quantized
    page_table = 4  # the pool's [1, 1] int32 placeholder table
    assert cache_bytes(fp8) == 8 * page_bytes(CFG, 16, jnp.bfloat16, "fp8") + page_table
    # 64 fp8 values + a float32 scale per token and head against 64 bf16 values: 68 / 128.
    assert cache_bytes(fp8) <= 0.54 * cache_bytes(bf16)


def test_fp8_write_round_trips_within_e4m3_precision():
    _, k, v = _random_qkv(2, 5)
    pool = init_paged_cache(CFG, 2, 16, jnp.bfloat16, page_size=8, kv_dtype="fp8")
    written = _write(pool, k, v, jnp.broadcast_to(jnp.arange(5), (2, 5)))
    stored = written.k_pages[0][:, 0, :5].astype(jnp.float32) * written.k_scales[0][:, 0, :5, None]
    expected = np.swapaxes(np.asarray(k[0]), 0, 1)  # [KV, T, K]
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 (plus subnormals far below the absmax).
    np.testing.assert_array_less(np.abs(stored - expected), np.abs(expected) / 16 + 1e-3)


@pytest.mark.parametrize("cpu_kernels", [False, True])
def test_fp8_contiguous_cache_equals_fp8_pages_and_is_near_float(cpu_kernels):
    if cpu_kernels and not kernels_available():
        pytest.skip("the native CPU kernels do not build here")
    batch, steps_ = 2, 11
    q, k, v = _random_qkv(batch, steps_)
    positions = jnp.broadcast_to(jnp.arange(steps_), (batch, steps_))
    exact = _attend(q, _write(init_cache(CFG, batch, 32, jnp.float32), k, v, positions), positions)
    dense = _write(init_cache(CFG, batch, 32, jnp.float32, cpu_kernels, kv_dtype="fp8"), k, v, positions)
    paged = _write(init_paged_cache(CFG, batch, 32, jnp.float32, page_size=8, kv_dtype="fp8"), k, v, positions)
    assert dense.k[0].dtype == jnp.float8_e4m3fn
    out = _attend(q, dense, positions)
    decode = _attend(q[:, -1:], dense, positions[:, -1:])  # few queries: XLA's path, not the kernel
    np.testing.assert_allclose(out, _attend(q, paged, positions), atol=1e-5)
    np.testing.assert_allclose(decode, out[:, -1:], atol=1e-5)
    error = np.abs(np.asarray(out) - np.asarray(exact))
    assert error.mean() < 0.03 and error.max() < 0.2, (error.mean(), error.max())


def test_pallas_backend_sends_fp8_pages_to_the_reference():
    pages = init_paged_cache(CFG, 1, 16, jnp.bfloat16, page_size=8, kv_dtype="fp8", backend="pallas", interpret=True)
    assert kernel_backend(pages, CFG.head_dim) == "reference"
    for platform in ("gpu", "tpu"):
        reason = pallas_kernels.unsupported_reason(platform, 64, jnp.float8_e4m3fn, 16, quantized=True)
        assert "not float8_e4m3fn" in reason


def test_the_contiguous_cache_rejects_int8_and_the_spec_unknown_dtypes_by_name():
    assert CacheSpec(kv_dtype="fp8").kv_dtype == "fp8"
    with pytest.raises(ValueError, match="kv_dtype 'int8' is not one of auto, fp8"):
        init_cache(CFG, 1, 8, jnp.bfloat16, kv_dtype="int8")
    with pytest.raises(ValueError, match="kv_cache_dtype 'e5m2' is not one of auto, int8, fp8"):
        CacheSpec(kv_dtype="e5m2")


@pytest.fixture(scope="module")
def bf16_and_fp8():
    """The demo model with a bf16 and an fp8 page pool (engine path), same weights."""
    make = lambda kv: LLM(dtype="bfloat16", max_seq_len=128, num_pages=48, kv_cache_dtype=kv)  # noqa: E731
    return make("auto"), make("fp8")


def test_fp8_pool_keeps_greedy_agreement_with_bf16_on_the_demo_model(bf16_and_fp8):
    bf16, fp8 = bf16_and_fp8
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    same = [np.mean(np.array(a.token_ids) == np.array(b.token_ids))
            for a, b in zip(bf16.generate(PROMPTS, params), fp8.generate(PROMPTS, params))]
    assert np.mean(same) >= 0.95, same
    assert cache_bytes(fp8.engine.runner.pages) <= 0.54 * cache_bytes(bf16.engine.runner.pages)


def test_fp8_contiguous_cache_logits_stay_close_to_bf16_on_the_demo_model(bf16_and_fp8):
    llm = bf16_and_fp8[0]
    ids = llm.tokenize("import os\nimport sys\n\ndef main(argv):\n    for path in argv:\n")
    tokens = jnp.asarray([ids + [0] * (64 - len(ids))], jnp.int32)
    logits = {
        kv: np.asarray(step_programs.all_logits(
            llm._run_weights, tokens, init_cache(llm.config, 1, 64, llm.dtype, llm.cpu_kernels, kv_dtype=kv), cfg=llm.config
        )[0, : len(ids)])
        for kv in ("auto", "fp8")
    }
    top1 = np.mean(logits["auto"].argmax(-1) == logits["fp8"].argmax(-1))
    drift = np.abs(logits["fp8"] - logits["auto"]).max(-1) / np.ptp(logits["auto"], axis=-1)
    assert top1 >= 0.95 and drift.max() < 0.05, (top1, drift.max())
