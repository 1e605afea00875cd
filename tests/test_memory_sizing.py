"""KV-pool sizing on accelerators, from fake `memory_stats()` dicts (the CPU reports none)."""

from __future__ import annotations

import jax
import pytest

from jaxinfer import LLM
from jaxinfer.cache import paged
from jaxinfer.config.engine import EngineConfig, device_pages
from jaxinfer.engine.engine import LLMEngine
from jaxinfer.entrypoints.cli import parse
from jaxinfer.runtime import pools

GB = 10**9
# What jax.Device.memory_stats() holds on a GPU after a load: the weights in use, the load's peak.
H100 = {"bytes_limit": 60 * GB, "bytes_in_use": 3 * GB, "peak_bytes_in_use": 9 * GB}
PAGE = 2 * 16 * 16 * 8 * 128 * 2  # K and V, 16 layers, 16 tokens, 8 kv heads, head_dim 128, bf16


def test_pool_fills_the_budget_after_weights_and_activations():
    assert device_pages(H100, 0.9, PAGE, 2 * GB) == (54 * GB - 3 * GB - 2 * GB) // PAGE
    assert device_pages(H100, 0.5, PAGE, 0) == (30 * GB - 3 * GB) // PAGE
    stale_peak = {**H100, "peak_bytes_in_use": 59 * GB}  # an earlier model's: JAX cannot reset it
    assert device_pages(stale_peak, 0.9, PAGE, 2 * GB) == device_pages(H100, 0.9, PAGE, 2 * GB)


def test_a_budget_the_weights_fill_is_an_error_naming_the_knob():
    pages = device_pages({**H100, "bytes_in_use": 55 * GB}, 0.9, PAGE, 2 * GB)
    assert pages == 0
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(max_seq_len=1024).resolve_num_pages(PAGE, pages)


def test_defaults_are_vllms_on_accelerators_and_unchanged_on_cpu():
    config = EngineConfig(max_seq_len=256, max_num_seqs=8, page_size=16)
    assert config.memory_utilization == 0.9
    assert config.resolve_num_pages(PAGE, None) == 4 * 16 + 1  # CPU: half of max_num_seqs at full length
    assert config.resolve_num_pages(PAGE, 700) == 700
    assert EngineConfig(max_seq_len=256, num_pages=40).resolve_num_pages(PAGE, 700) == 40


class FakeAccelerator:
    """The CPU device, reporting `stats` as its memory."""

    def __init__(self, device, stats: dict[str, int]):
        self.device, self.stats = device, stats

    def memory_stats(self) -> dict[str, int]:
        return dict(self.stats)

    def __getattr__(self, name: str):
        return getattr(self.device, name)


@pytest.fixture(scope="module")
def llm(checkpoint_dir):
    return LLM(checkpoint_dir("llama3"), dtype="float32", max_seq_len=96, max_num_seqs=4, max_num_batched_tokens=32,
               max_prefill_seqs=1, decode_steps=4, num_pages=16)


@pytest.mark.parametrize("utilization", [None, 0.5])
def test_an_accelerator_sizes_its_pool_from_its_memory(llm, monkeypatch, utilization):
    stats = {"bytes_limit": 40 << 20, "bytes_in_use": 8 << 20, "peak_bytes_in_use": 30 << 20}
    device = jax.local_devices()[0]
    monkeypatch.setattr(pools.jax, "local_devices", lambda: [FakeAccelerator(device, stats)])
    config = EngineConfig(max_seq_len=96, max_num_seqs=4, max_num_batched_tokens=32, max_prefill_seqs=1,
                          decode_steps=4, gpu_memory_utilization=utilization)
    engine = LLMEngine(llm._run_weights, llm.config, None, config, llm.dtype, llm.cache_spec)
    page = paged.page_bytes(llm.config, config.page_size, llm.dtype, "auto")
    activations = engine._activation_peak()
    assert activations > 0
    expected = device_pages(stats, utilization or 0.9, page, activations)
    assert engine.blocks.num_pages == expected > config.pages_per_seq


def test_the_cli_takes_gpu_memory_utilization():
    assert parse(["serve", "--gpu-memory-utilization", "0.8"]).gpu_memory_utilization == 0.8
    assert parse(["generate", "--prompt", "x"]).gpu_memory_utilization is None
