"""vLLM's --generation-config (auto / vllm / DIR) and --override-generation-config: the server's default
sampling settings, and what they refuse by name (test_server_https runs them in a real server)."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from jaxinfer.entrypoints.openai.generation_flags import check_generation_flags, sampling_defaults
from jaxinfer.entrypoints.openai.launch import add_serve_parser


def _parse(*argv: str) -> argparse.Namespace:
    commands = argparse.ArgumentParser(prog="jaxinfer").add_subparsers()
    add_serve_parser(commands)
    args = commands.choices["serve"].parse_args(list(argv))
    check_generation_flags(args)
    return args


@pytest.fixture()
def dirs(tmp_path):
    """(model, other): two directories whose generation_config.json set different sampling defaults."""
    model, other = tmp_path / "model", tmp_path / "other"
    for path, settings in ((model, {"temperature": 0.3, "top_k": 5, "eos_token_id": 2}), (other, {"top_p": 0.5})):
        path.mkdir()
        (path / "generation_config.json").write_text(json.dumps(settings))
    return model, other


def _fields(params) -> tuple:
    return params.temperature, params.top_k, params.top_p, params.min_p


def test_the_sources_and_the_override(dirs):
    model, other = dirs
    assert _fields(sampling_defaults(_parse(), model)) == (0.3, 5, 1.0, 0.0)  # auto: the model's
    assert _fields(sampling_defaults(_parse("--generation-config", "vllm"), model)) == (1.0, 0, 1.0, 0.0)
    assert _fields(sampling_defaults(_parse("--generation-config", str(other)), model)) == (1.0, 0, 0.5, 0.0)
    merged = _parse("--override-generation-config", '{"temperature": 0, "min_p": 0.1}')
    assert _fields(sampling_defaults(merged, model)) == (0.0, 5, 1.0, 0.1)
    only = _parse("--generation-config", "vllm", "--override-generation-config", '{"top_k": 3}')
    assert _fields(sampling_defaults(only, model)) == (1.0, 3, 1.0, 0.0)


@pytest.mark.parametrize("argv, message", [
    (["--generation-config", "/nonexistent"], "--generation-config '/nonexistent': give auto, vllm or a directory"),
    (["--override-generation-config", "temperature=0"], "--override-generation-config must be a JSON object"),
    (["--override-generation-config", "[1]"], "--override-generation-config must be a JSON object such as"),
    (["--override-generation-config", '{"max_new_tokens": 8, "eos_token_id": 1}'],
     "--override-generation-config: 'eos_token_id', 'max_new_tokens' cannot be set here; accepted: temperature, "
     "top_k, top_p, min_p, repetition_penalty (max_tokens: --max-tokens-limit)"),
    (["--override-generation-config", '{"temperature": -1}'],
     "--override-generation-config: temperature must be >= 0, got -1"),
])
def test_values_that_cannot_be_served_are_refused_by_name(argv, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _parse(*argv)
