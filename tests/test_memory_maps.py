"""Warm-up stops short of Linux's cap on memory maps (XLA:CPU maps every compiled kernel), and engines
drop the compiled programs near it instead of letting the JIT abort the process."""

from __future__ import annotations

import logging
import sys

import jax
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.runtime import memory_maps
from jaxinfer.runtime import warmup as warmup_module

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps is Linux only")


def own_maps() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


def test_headroom_is_the_cap_less_this_process_maps(monkeypatch, tmp_path):
    cap = tmp_path / "max_map_count"
    cap.write_text(f"{own_maps() + 10_000}\n")
    monkeypatch.setattr(memory_maps, "MAX_MAP_COUNT", cap)
    assert 9_900 <= memory_maps.map_headroom() <= 10_000
    # 10k free of a cap of (maps + 10k): continuing needs a quarter of the cap free after one more program
    assert memory_maps.warmup_may_continue(per_program=0) == (10_000 > memory_maps.RESERVE * (own_maps() + 10_000))
    cap.write_text(f"{own_maps() + 10}\n")
    assert not memory_maps.warmup_may_continue(per_program=300)


def test_unknown_cap_never_stops_warmup(monkeypatch, tmp_path):
    monkeypatch.setattr(memory_maps, "MAX_MAP_COUNT", tmp_path / "missing")
    assert memory_maps.map_headroom() is None and memory_maps.warmup_may_continue(per_program=10**9)


def test_warmup_stops_with_a_warning_naming_the_cap(checkpoint_dir, monkeypatch, caplog):
    llm = LLM(checkpoint_dir("llama3"), dtype="float32", max_seq_len=96, max_num_seqs=2,
              max_num_batched_tokens=32, max_prefill_seqs=1, decode_steps=1, num_pages=16)
    calls = []
    monkeypatch.setattr(warmup_module, "warmup_may_continue", lambda per_program: calls.append(per_program) or len(calls) <= 2)
    with caplog.at_level(logging.WARNING, logger=warmup_module.log.name):
        compiled = llm.engine.warmup()
    if jax.default_backend() != "cpu":  # GPU/TPU programs map no host memory: the cap is never read
        assert compiled > 2 and not calls and "vm.max_map_count" not in caplog.text
        return
    assert compiled == 2
    assert "vm.max_map_count" in caplog.text and "warm-up stopped after 2 of" in caplog.text


def fake_cap(monkeypatch, tmp_path, headroom: int) -> None:
    """The cap read as this process's maps plus `headroom` (the kernel's own cap is left alone)."""
    cap = tmp_path / "max_map_count"
    cap.write_text(f"{own_maps() + headroom}\n")
    monkeypatch.setattr(memory_maps, "MAX_MAP_COUNT", cap)


def test_programs_stay_while_the_cap_is_far(monkeypatch, tmp_path, caplog):
    fake_cap(monkeypatch, tmp_path, headroom=50_000)
    jax.jit(lambda x: x * 3)(1.0)  # a program compiled since the last look: the maps are read
    with caplog.at_level(logging.WARNING, logger=memory_maps.log.name):
        assert not memory_maps.release_programs_near_cap()
    assert "vm.max_map_count" not in caplog.text


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="only XLA:CPU maps compiled programs into the process")
def test_engine_drops_compiled_programs_near_the_cap(checkpoint_dir, monkeypatch, tmp_path, caplog):
    llm = LLM(checkpoint_dir("llama3"), dtype="float32", max_seq_len=96, max_num_seqs=2, decode_steps=2)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    expected = llm.generate([[5, 6, 7, 8]], params)[0].token_ids
    before = own_maps()
    fake_cap(monkeypatch, tmp_path, headroom=100)  # under a tenth of the cap free
    jax.jit(lambda x: x + 1)(1.0)
    with caplog.at_level(logging.WARNING, logger=memory_maps.log.name):
        again = llm.generate([[5, 6, 7, 8]], params)[0].token_ids
    assert "dropping all compiled programs" in caplog.text and "vm.max_map_count" in caplog.text
    assert again == expected
    # Loading the model compiled programs this generate did not bring back: they are unmapped.
    assert own_maps() < before


def test_compile_count_grows_with_each_new_program_and_not_with_a_cached_one():
    """What a soak reads (GET /metrics, jaxinfer:compiled_programs_total) to tell whether a warmed server
    still compiles."""
    import numpy as np

    add = jax.jit(lambda x: x + 1.5)
    before = memory_maps.compile_count()
    add(np.zeros(3, np.float32))
    once = memory_maps.compile_count()
    add(np.ones(3, np.float32))  # the same shape: jit's cache, no compile
    assert once == before + 1 and memory_maps.compile_count() == once
    add(np.zeros(4, np.float32))
    assert memory_maps.compile_count() == once + 1
