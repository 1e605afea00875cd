"""Saved sessions: a prompt's KV saved by one LLM and restored into another's prefix cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxinfer import LLM, SamplingParams
from jaxinfer.checkpoint import kv_session
from jaxinfer.config.errors import CheckpointError
from jaxinfer.speculative.config import SpeculativeConfig

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
PROMPT = np.random.RandomState(7).randint(3, 250, size=40).tolist()  # 2 full pages of 16 and 8 tokens
CONTINUED = PROMPT + [5, 9, 11]
KNOBS = dict(dtype="float32", max_seq_len=96, max_num_seqs=4, max_num_batched_tokens=32, decode_steps=4,
             num_pages=16)


@pytest.fixture(scope="module")
def model(checkpoint_dir) -> Path:
    return checkpoint_dir("llama3")


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sessions") / "prompt"
    info = LLM(model, **KNOBS).save_session(path, PROMPT)
    assert info.num_cached_tokens == 32 and info.token_ids == PROMPT
    return path


@pytest.fixture(scope="module")
def expected(model) -> list[int]:
    """Greedy ids of CONTINUED without any cached prefix."""
    return LLM(model, **KNOBS, enable_prefix_caching=False).generate([CONTINUED], GREEDY)[0].token_ids


def test_a_loaded_session_serves_its_pages_and_keeps_greedy_outputs(model, saved, expected):
    llm = LLM(model, **KNOBS)
    hits = llm.metrics()["prefix_cache_hits"]
    info = llm.load_session(saved)
    assert (info.token_ids, info.num_cached_tokens, info.pages_written) == (PROMPT, 32, 2)
    assert llm.generate([CONTINUED], GREEDY)[0].token_ids == expected
    assert llm.metrics()["prefix_cache_hits"] - hits == 32  # the prompt's two full pages were not computed
    usable = llm.engine.blocks.usable_pages
    assert llm.load_session(saved).pages_written == 0  # already cached: nothing written, nothing taken
    assert llm.engine.blocks.usable_pages == usable


def test_a_session_loads_however_the_same_weights_run(model, saved, expected):
    """Packed for the CPU kernels when saved, unpacked here: the fingerprint is of the weights as loaded."""
    llm = LLM(model, **KNOBS, cpu_kernels=False)
    assert llm.load_session(saved).pages_written == 2
    assert llm.generate([CONTINUED], GREEDY)[0].token_ids == expected


def test_outputs_read_the_restored_pages(model, saved, expected, tmp_path):
    """The same session with its values scaled gives other tokens: the restored K/V is what runs."""
    meta = kv_session.read_meta(saved)
    pages = {name: values * 3.0 for name, values in kv_session.read_pages(saved).items()}
    settings = {key: meta[key] for key in ("fingerprint", "page_size", "kv_cache_dtype", "buffers")}
    kv_session.write_session(tmp_path / "scaled", settings, meta["token_ids"], pages, overwrite=False)
    llm = LLM(model, **KNOBS)
    llm.load_session(tmp_path / "scaled")
    assert llm.generate([CONTINUED], GREEDY)[0].token_ids != expected


def test_a_session_loads_only_where_weights_and_cache_settings_match(model, saved, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(model, other)
    tensors = load_file(other / "model.safetensors")
    name = next(n for n in tensors if n.endswith("q_proj.weight"))
    tensors[name] = tensors[name] + np.float32(1e-3)
    save_file(tensors, other / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="saved from other weights"):
        LLM(other, **KNOBS).load_session(saved)
    with pytest.raises(CheckpointError, match="page_size=16"):
        LLM(model, **{**KNOBS, "page_size": 8, "num_pages": 32}).load_session(saved)
    with pytest.raises(CheckpointError, match="kv_cache_dtype='auto'"):
        LLM(model, **KNOBS, kv_cache_dtype="int8").load_session(saved)
    with pytest.raises(ValueError, match="enable_prefix_caching=False"):
        LLM(model, **KNOBS, enable_prefix_caching=False).load_session(saved)
    with pytest.raises(CheckpointError, match="no session.json"):
        LLM(model, **KNOBS).load_session(tmp_path)


def test_a_pool_too_small_refuses_the_session_and_keeps_its_pages(model, tmp_path):
    long = np.random.RandomState(3).randint(3, 250, size=200).tolist()  # 12 full pages
    LLM(model, **{**KNOBS, "max_seq_len": 256, "num_pages": 32}).save_session(tmp_path / "long", long)
    small = LLM(model, **{**KNOBS, "num_pages": 8})
    usable = small.engine.blocks.usable_pages
    with pytest.raises(ValueError, match="needs 12 free pages, the pool has 7"):
        small.load_session(tmp_path / "long")
    assert small.engine.blocks.usable_pages == usable and not small.engine.blocks.by_hash


def test_saving_checks_its_prompt_and_its_directory(model, saved):
    llm = LLM(model, **KNOBS)
    with pytest.raises(ValueError, match="fills no page"):
        llm.save_session(saved.parent / "short", PROMPT[:15])
    with pytest.raises(CheckpointError, match="not empty"):
        llm.save_session(saved, PROMPT)
    (saved.parent / "a_file").write_text("x")
    with pytest.raises(CheckpointError, match="is a file"):
        llm.save_session(saved.parent / "a_file", PROMPT)
    info = llm.save_session(saved, PROMPT[:36], overwrite=True)
    assert json.loads((saved / "session.json").read_text())["token_ids"] == PROMPT[:36]
    assert info.num_cached_tokens == 32


def test_int8_pages_travel_with_their_scales(model, tmp_path):
    knobs = {**KNOBS, "kv_cache_dtype": "int8"}
    saver = LLM(model, **knobs)
    saver.save_session(tmp_path / "int8", PROMPT)
    assert set(kv_session.read_pages(tmp_path / "int8")) == {"k_pages", "v_pages", "k_scales", "v_scales"}
    expected = saver.generate([CONTINUED], GREEDY)[0].token_ids  # read from its own cached pages
    llm = LLM(model, **knobs)
    assert llm.load_session(tmp_path / "int8").pages_written == 2
    assert llm.generate([CONTINUED], GREEDY)[0].token_ids == expected


def test_the_device_lookup_gets_the_session_tokens(model, saved):
    llm = LLM(model, **KNOBS, speculative=SpeculativeConfig(method="ngram_device", num_speculative_tokens=3))
    llm.load_session(saved)
    pages, _ = llm.engine.blocks.match_pages(PROMPT[:32])
    llm.engine.blocks.release(pages)
    stored = np.asarray(llm.engine.runner.draft.tokens)[pages]
    assert stored.reshape(-1).tolist() == PROMPT[:32]
