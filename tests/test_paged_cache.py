"""The paged KV cache: pure writes through a page table, and generation the same on every attention backend."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.contiguous import cache_bytes, init_cache
from jaxinfer.cache.paged import init_paged_cache
from jaxinfer.models.attention import attend
from jaxinfer.models.registry import from_hf_config

CFG = from_hf_config(dict(architectures=["LlamaForCausalLM"], vocab_size=16, hidden_size=32,
                          intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                          num_key_value_heads=2))
PROMPTS = [np.random.RandomState(i).randint(3, 256, size=n).tolist() for i, n in enumerate([3, 21, 40])]


def _random_kv(key, batch, steps):
    k1, k2, k3 = jax.random.split(key, 3)
    shape = (batch, steps, CFG.num_kv_heads, CFG.head_dim)
    q = jax.random.normal(k1, (batch, steps, CFG.num_heads, CFG.head_dim))
    return q, jax.random.normal(k2, shape), jax.random.normal(k3, shape)


@pytest.mark.parametrize("window", [0, 5])
def test_shuffled_page_table_matches_contiguous_attention(window):
    batch, steps, max_len, page = 3, 19, 32, 4
    table = np.random.RandomState(0).permutation(batch * max_len // page).reshape(batch, -1).astype(np.int32)
    paged = init_paged_cache(CFG, batch, max_len, jnp.float32, page_size=page, page_table=table)
    dense = init_cache(CFG, batch, max_len, jnp.float32)
    q, k, v = _random_kv(jax.random.key(1), batch, steps)
    positions = jnp.broadcast_to(jnp.arange(steps), (batch, steps))
    paged, dense = paged.write(0, k, v, positions), dense.write(0, k, v, positions)
    expected = attend(q, dense, 0, positions, window)
    np.testing.assert_allclose(attend(q, paged, 0, positions, window), expected, atol=1e-5)
    decode = attend(q[:, -1:], paged, 0, positions[:, -1:], window)
    np.testing.assert_allclose(decode, expected[:, -1:], atol=1e-5)


def test_writes_beyond_the_page_table_are_dropped_not_wrapped():
    paged = init_paged_cache(CFG, 1, 8, jnp.float32, page_size=4)
    _, k, v = _random_kv(jax.random.key(2), 1, 2)
    written = paged.write(0, k, v, jnp.array([[7, 8]]))  # 8 is past the 2-page table
    pages = np.asarray(written.k_pages[0])  # [KV, P, page, K]
    np.testing.assert_array_equal(pages[:, 1, 3], np.asarray(k[0, 0]))
    assert np.count_nonzero(pages) == np.count_nonzero(np.asarray(k[0, 0]))


def test_int8_pages_halve_bytes_and_quantize_on_write():
    cfg64 = from_hf_config(dict(architectures=["LlamaForCausalLM"], vocab_size=16, hidden_size=128,
                                intermediate_size=32, num_hidden_layers=2, num_attention_heads=2))
    bf16 = init_paged_cache(cfg64, 2, 64, jnp.bfloat16)
    int8q = init_paged_cache(cfg64, 2, 64, jnp.bfloat16, kv_dtype="int8")
    pages = lambda c: sum(x.nbytes for x in c.k_pages + c.v_pages)  # noqa: E731
    assert pages(int8q) * 2 == pages(bf16)
    assert cache_bytes(int8q) < 0.54 * cache_bytes(bf16)  # float32 scales add 4 bytes per 64 values
    int8 = init_paged_cache(CFG, 2, 64, jnp.bfloat16, kv_dtype="int8")
    _, k, v = _random_kv(jax.random.key(3), 2, 5)
    written = int8.write(0, k, v, jnp.broadcast_to(jnp.arange(5), (2, 5)))
    restored = written.k_pages[0][:, :1, :5].astype(jnp.float32) * written.k_scales[0][:, :1, :5, None]
    np.testing.assert_allclose(restored[:, 0], np.swapaxes(np.asarray(k[0]), 0, 1), atol=0.03)


@pytest.fixture(scope="module")
def greedy_reference(checkpoint_dir):
    llm = LLM(checkpoint_dir("mistral"), dtype="float32", max_seq_len=96)
    return llm.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))


@pytest.mark.parametrize("options", [
    dict(attention_backend="reference"),
    dict(attention_backend="pallas", interpret_kernels=True),
], ids=["reference", "pallas-interpret"])
def test_every_attention_backend_gives_the_default_greedy_output(options, checkpoint_dir, greedy_reference):
    llm = LLM(checkpoint_dir("mistral"), dtype="float32", max_seq_len=96, page_size=16, **options)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    assert [o.token_ids for o in outs] == [o.token_ids for o in greedy_reference]


def test_bad_cache_options_are_explained(checkpoint_dir):
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp4' is not one of auto, int8"):
        LLM(checkpoint_dir("llama2"), kv_cache_dtype="fp4")
