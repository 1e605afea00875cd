"""generation_config.json: extra EOS ids stop generation; its sampling settings are the defaults."""

from __future__ import annotations

import json
import shutil

import pytest

from jaxinfer import LLM, SamplingParams, load_config
from jaxinfer.config.generation import GenerationDefaults, generation_defaults

PROMPT = [5, 9, 14, 3, 77, 41, 8]


def with_generation_config(src, dst, **fields):
    """A copy of the checkpoint at src whose generation_config.json holds `fields`."""
    shutil.copytree(src, dst)
    (dst / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, **fields}))
    return dst


@pytest.fixture(scope="module")
def free_run(checkpoint_dir) -> list[int]:
    """Greedy tokens of the tiny llama2 checkpoint, ignoring EOS."""
    llm = LLM(checkpoint_dir("llama2"), dtype="float32", max_seq_len=64)
    return llm.generate([PROMPT], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0].token_ids


def test_list_eos_ids_join_the_config_ones(tmp_path, checkpoint_dir):
    model = with_generation_config(checkpoint_dir("llama2"), tmp_path / "m", eos_token_id=[2, 7, 9])
    assert load_config(model).eos_token_ids == (2, 7, 9)
    assert generation_defaults(model).eos_token_ids == (2, 7, 9)


def test_generation_stops_at_an_eos_id_listed_only_in_generation_config(tmp_path, checkpoint_dir, free_run):
    stop_at = free_run[5]
    assert stop_at != 2, "pick a token that config.json does not already list"
    model = with_generation_config(checkpoint_dir("llama2"), tmp_path / "m", eos_token_id=[2, stop_at])
    llm = LLM(model, dtype="float32", max_seq_len=64)
    out = llm.generate([PROMPT], SamplingParams(max_tokens=20, temperature=0))[0]
    assert out.token_ids == free_run[: free_run.index(stop_at) + 1]
    assert out.finish_reason == "stop"


def test_sampling_settings_are_defaults_that_explicit_params_override(tmp_path, checkpoint_dir, free_run):
    settings = dict(temperature=0.0, top_k=20, top_p=0.9, repetition_penalty=1.0, max_new_tokens=5, do_sample=False)
    model = with_generation_config(checkpoint_dir("llama2"), tmp_path / "m", eos_token_id=2, **settings)
    llm = LLM(model, dtype="float32", max_seq_len=64)
    expected = SamplingParams(temperature=0.0, top_k=20, top_p=0.9, repetition_penalty=1.0, max_tokens=5)
    assert llm.default_params == expected
    by_default = llm.generate([PROMPT])[0]
    assert len(by_default.token_ids) <= 5 and by_default.token_ids == free_run[: len(by_default.token_ids)]
    explicit = llm.generate([PROMPT], SamplingParams(max_tokens=9, temperature=0, ignore_eos=True))[0]
    assert explicit.token_ids == free_run[:9]


def test_missing_file_means_no_defaults(tmp_path):
    assert generation_defaults(tmp_path) == GenerationDefaults()
