"""KV offloading: prefix pages the device pool evicts kept in host memory and copied back on a later hit.

A tiny saved Llama 3 in a pool of 7 usable pages of 16 tokens: a 70-token turn 1 (4 full pages cached),
two other 70-token prompts that evict it, then turn 2 (turn 1's prompt and answer, and more).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import openai
import pytest
from compile_counter import CompileCounter
from live_server import metrics, serve_in_thread

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache import page_io, paged
from jaxinfer.config.engine import EngineConfig
from jaxinfer.engine.host_kv_store import HostPageStore
from jaxinfer.entrypoints.cli import build_parser
from jaxinfer.entrypoints.openai import ServerConfig
from jaxinfer.runtime import step_programs
from jaxinfer.runtime.executables import Executables
from jaxinfer.runtime.kv_offload import PageMover

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
_rng = np.random.RandomState(3)
TURN_1 = _rng.randint(3, 250, 70).tolist()
OTHERS = [_rng.randint(3, 250, 70).tolist() for _ in range(2)]
KNOBS = dict(dtype="float32", max_seq_len=96, max_num_seqs=2, max_num_batched_tokens=32, decode_steps=4, num_pages=8)
PAGE_BYTES = 4096  # float32: 2 layers x K and V x 2 kv heads x 16 tokens x 16 dims x 4 bytes
GIB = 2**30


def conversation(llm: LLM) -> tuple[list[int], list[int], int | None]:
    """Turn 1's tokens, turn 2's, and how many of turn 2's prompt tokens were served from a cache."""
    first = llm.generate([TURN_1], GREEDY)[0].token_ids
    for prompt in OTHERS:
        llm.generate([prompt], GREEDY)
    second = llm.generate([TURN_1 + first + [7, 8, 9]], GREEDY)[0]
    return first, second.token_ids, second.num_cached_tokens


@pytest.fixture(scope="module")
def model(checkpoint_dir):
    return checkpoint_dir("llama3")


@pytest.fixture(scope="module")
def plain_llm(model) -> LLM:
    return LLM(model, **KNOBS)


@pytest.fixture(scope="module")
def plain(plain_llm) -> tuple[list[int], list[int], int | None]:
    return conversation(plain_llm)


@pytest.fixture(scope="module")
def offloaded(model) -> LLM:
    return LLM(model, **KNOBS, kv_offloading_size=64 * PAGE_BYTES / GIB)


def test_a_second_turn_copies_its_evicted_prefix_back_with_the_same_tokens(offloaded, plain):
    llm, counter = offloaded, CompileCounter()
    assert llm.engine.warmup() == llm.engine.program_count()
    counter.active = True
    try:
        first, second, cached = conversation(llm)
    finally:
        counter.active = False
    assert counter.count == 0  # warm-up compiled the gathers and scatters of every page-count bucket
    assert (first, second) == plain[:2]
    assert plain[2] == 0  # the device cache alone lost turn 1 to the other prompts
    assert cached == 64  # turn 1's 4 full pages, from the host tier
    values = llm.metrics()
    assert values["kv_offload_loaded_pages"] == 4 and values["kv_offload_loaded_bytes"] == 4 * PAGE_BYTES
    assert values["kv_offload_stored_pages"] >= 8 and values["prefix_cache_hits"] >= 64
    store = llm.engine.blocks.host
    assert values["kv_offload_store_bytes"] == store.used_bytes == len(store.pages) * PAGE_BYTES
    assert all(sum(a.nbytes for a in page.values().values()) == PAGE_BYTES for page in store.pages.values())


def test_offloading_adds_a_gather_and_a_scatter_per_page_count_bucket(offloaded, plain_llm):
    """Pages per sequence 6: buckets 1, 2, 4 and 8, so 8 programs more than the plain engine's set."""
    assert offloaded.engine.runner.mover.buckets == [1, 2, 4, 8]
    assert offloaded.engine.program_count() == plain_llm.engine.program_count() + 8


def test_the_host_store_keeps_its_bound_dropping_the_oldest_pages(model):
    """Room for 3 pages: turn 1's pages are evicted last one first (A4, A3, A2, A1), then the first other
    prompt's (B4, B3); the store keeps the last 3 stored, and turn 2 finds its first page there."""
    llm = LLM(model, **KNOBS, kv_offloading_size=3 * PAGE_BYTES / GIB)
    first = llm.generate([TURN_1], GREEDY)[0].token_ids
    blocks = llm.engine.blocks
    a1, b4, b3 = blocks.chain(TURN_1, 1)[0], *blocks.chain(OTHERS[0], 4)[:1:-1]
    for prompt in OTHERS:
        llm.generate([prompt], GREEDY)
    store = blocks.host
    assert list(store.pages) == [a1, b4, b3] and store.stored_pages == 6
    assert store.used_bytes == 3 * PAGE_BYTES <= store.capacity_bytes < 4 * PAGE_BYTES
    assert llm.generate([TURN_1 + first + [7]], GREEDY)[0].num_cached_tokens == 16


def test_the_store_drops_the_least_recently_used_page():
    store = HostPageStore(capacity_bytes=3 * 100 + 99, page_bytes=100)
    for name in (b"a", b"b", b"c"):
        store.put(name, name)
    assert store.take(b"a") == b"a"  # used again: now the most recent
    store.put(b"d", b"d")
    assert list(store.pages) == [b"c", b"a", b"d"] and store.used_bytes == 300


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_quantized_pages_and_scales_come_back_bitwise(offloaded, kv_dtype):
    """Pages of an int8 / fp8 pool (random values and scales) offloaded, then written into other pages of it:
    every layer's K, V and scales bitwise as they were."""
    cfg, rng = offloaded.config, np.random.default_rng(0)
    pool = paged.init_page_pool(cfg, 12, 16, jnp.float32, kv_dtype)
    filled = {name: [jnp.asarray(rng.integers(0, 120, layer.shape).astype(layer.dtype)) if layer.dtype != jnp.float32
                     else jnp.asarray(rng.random(layer.shape, np.float32)) for layer in layers]
              for name, layers in page_io.page_buffers(pool).items()}
    pool = dataclasses.replace(pool, **filled)
    mover = PageMover(Executables(None, step_programs.static_argnames), max_pages=4)
    before = page_io.read_pages(pool, [3, 5, 6])
    copies = mover.offload(pool, [3, 5, 6])
    pool = mover.write(pool, [9, 10, 11], {name: np.stack([c.values()[name] for c in copies], axis=2)
                                           for name in before})
    assert set(before) == {"k_pages", "v_pages", "k_scales", "v_scales"}
    after = page_io.read_pages(pool, [9, 10, 11])
    for name in before:
        assert after[name].tobytes() == before[name].tobytes()


@pytest.mark.parametrize("size, error", [
    (-1, "kv_offloading_size must be a number of GiB >= 0 .* got -1"),
    ("4", "kv_offloading_size must be a number of GiB >= 0 .* got '4'"),
    (float("nan"), "kv_offloading_size must be a number of GiB >= 0 .* got nan"),
])
def test_bad_sizes_are_refused_by_name(size, error):
    with pytest.raises(ValueError, match=error):
        EngineConfig(max_seq_len=64, kv_offloading_size=size)


def test_offloading_without_prefix_caching_is_refused():
    with pytest.raises(ValueError, match=r"kv_offloading_size=2 .* prefix caching is off"):
        EngineConfig(max_seq_len=64, kv_offloading_size=2, enable_prefix_caching=False)
    assert EngineConfig(max_seq_len=64, kv_offloading_size=0, enable_prefix_caching=False).offload_bytes == 0


def test_the_server_flag_and_metrics(offloaded):
    args = build_parser().parse_args(["serve", "--model", "some-model", "--kv-offloading-size", "0.5"])
    assert args.kv_offloading_size == 0.5
    with serve_in_thread(offloaded, ServerConfig("tiny")) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        client.completions.create(model="tiny", prompt=OTHERS[0], max_tokens=2, temperature=0)
        values = metrics(url)
    assert values["jaxinfer:kv_offload_stored_pages_total"] >= 8
    assert values["jaxinfer:kv_offload_store_capacity_bytes"] == 64 * PAGE_BYTES
