"""attention_backend="pallas" runs every head size: odd ones padded, impossible ones on the reference."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_models import save_hf_model

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.models.attention import paged_attend
from pallas_kernels import paged_attention_reference

PROMPTS = [[5, 9, 14, 3, 77, 120, 8], [44, 2, 19]]
GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("head_dim", [24, 80, 96])
def test_odd_head_dim_kernel_matches_reference(tmp_path, head_dim):
    path = save_hf_model("qwen3", tmp_path / f"qwen3_{head_dim}", head_dim=head_dim)
    runs = {}
    for backend in ("reference", "pallas"):
        llm = LLM(path, dtype="float32", max_seq_len=32, attention_backend=backend,
                  interpret_kernels=backend == "pallas")
        runs[backend] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert runs["pallas"] == runs["reference"]


def _cache(head_dim: int) -> PagedKVCache:
    """One layer, two sequences of two 16-token pages, random float32 pools."""
    keys = jax.random.split(jax.random.key(0), 2)
    pool = [jax.random.normal(k, (1, 4, 16, head_dim), jnp.float32) for k in keys]
    table = jnp.arange(4, dtype=jnp.int32).reshape(2, 2)
    return PagedKVCache([pool[0]], [pool[1]], None, None, table, backend="pallas", interpret=True)


def test_unsupported_shape_falls_back_with_one_log(caplog):
    head_dim = 4096  # no block of float32 keys this wide fits a GPU's shared memory
    cache = _cache(head_dim)
    q = jax.random.normal(jax.random.key(1), (2, 1, 2, head_dim), jnp.float32)
    positions = jnp.asarray([[20], [31]])
    with caplog.at_level(logging.WARNING, logger="jaxinfer.models.attention"):
        out = paged_attend(q, cache, 0, positions, 0)
        paged_attend(q, cache, 0, positions, 0)
    lengths = positions[:, -1] + 1
    expected = paged_attention_reference(q[:, 0], cache.k_pages[0], cache.v_pages[0], lengths, cache.page_table)
    np.testing.assert_allclose(np.asarray(out[:, 0]), np.asarray(expected), atol=1e-6)
    fallbacks = [r for r in caplog.records if "falls back" in r.getMessage()]
    assert len(fallbacks) == 1 and "4096" in fallbacks[0].getMessage()
