"""What timed runs use: device traces (vLLM's start_profile / stop_profile; `LLM` and the server's
routes write a trace that names the engine's step programs) and `LLM.reset_prefix_cache`."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest
from live_server import serve_in_thread

from jaxinfer import LLM, SamplingParams
from jaxinfer.entrypoints.openai import ServerConfig
from jaxinfer.runtime.profiling import PROFILER_DIR_VAR


@pytest.fixture(scope="module")
def llm(text_model_dir):
    return LLM(text_model_dir, dtype="float32", max_seq_len=128)


def traced_names(directory: Path) -> set[str]:
    """Every event name in the directory's Perfetto traces."""
    traces = list(directory.rglob("*.trace.json.gz"))
    assert traces, f"no trace under {directory}"
    return {event.get("name", "") for trace in traces
            for event in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]}


def test_a_profile_holds_the_step_programs(llm, tmp_path):
    assert llm.start_profile(tmp_path / "trace") == tmp_path / "trace"
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0))
    assert llm.stop_profile() == tmp_path / "trace"
    names = traced_names(tmp_path / "trace")
    assert any("ragged_step" in name for name in names), sorted(names)[:40]


def test_profile_misuse_says_what_to_do(llm, monkeypatch, tmp_path):
    monkeypatch.delenv(PROFILER_DIR_VAR, raising=False)
    with pytest.raises(ValueError, match=f"give trace_dir or set {PROFILER_DIR_VAR}"):
        llm.start_profile()
    with pytest.raises(RuntimeError, match="no profile is being recorded; call start_profile first"):
        llm.stop_profile()
    monkeypatch.setenv(PROFILER_DIR_VAR, str(tmp_path))
    assert llm.start_profile() == tmp_path
    with pytest.raises(RuntimeError, match="already being recorded"):
        llm.start_profile(tmp_path / "other")
    llm.stop_profile()


def test_server_profile_routes_exist_when_a_directory_is_set(llm, monkeypatch, tmp_path):
    monkeypatch.delenv(PROFILER_DIR_VAR, raising=False)
    with serve_in_thread(llm, ServerConfig("tiny")) as (url, _):
        assert httpx.post(url + "/start_profile").status_code == 404
    monkeypatch.setenv(PROFILER_DIR_VAR, str(tmp_path))
    with serve_in_thread(llm, ServerConfig("tiny")) as (url, _):
        assert httpx.post(url + "/start_profile").status_code == 200
        assert httpx.post(url + "/start_profile").status_code == 400
        body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4}
        assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200
        assert httpx.post(url + "/stop_profile").status_code == 200
        assert httpx.post(url + "/stop_profile").status_code == 400
    assert any("ragged_step" in name for name in traced_names(tmp_path))


def test_reset_prefix_cache_makes_the_next_run_compute_its_prompt(llm):
    prompt, params = list(range(5, 60)), SamplingParams(max_tokens=2, temperature=0)
    llm.generate([prompt], params)

    def hits_of_a_run() -> int:
        before = llm.metrics()["prefix_cache_hits"]
        llm.generate([prompt], params)
        return llm.metrics()["prefix_cache_hits"] - before

    assert hits_of_a_run() > 0
    assert llm.reset_prefix_cache() is True
    assert hits_of_a_run() == 0
