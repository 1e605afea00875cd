"""vLLM's --generation-config (auto / vllm / DIR) and --override-generation-config: the server's default
sampling settings, max_new_tokens as the cap on every request's max_tokens, and what they refuse by name
(test_server_https runs them in a real server)."""

from __future__ import annotations

import argparse
import json
import re
from types import SimpleNamespace

import pytest

from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.entrypoints.openai.app import ServerConfig, _max_new_tokens
from jaxinfer.entrypoints.openai.generation_flags import check_generation_flags, sampling_defaults, served_defaults
from jaxinfer.entrypoints.openai.launch import add_serve_parser
from jaxinfer.entrypoints.openai.serving import ServerState


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
    for path, settings in ((model, {"temperature": 0.3, "top_k": 5, "eos_token_id": 2, "max_new_tokens": 7}),
                           (other, {"top_p": 0.5})):
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
    (["--override-generation-config", '{"max_new_tokens": 8, "eos_token_id": 1, "do_sample": true}'],
     "--override-generation-config: 'do_sample', 'eos_token_id' cannot be set here; accepted: temperature, "
     "top_k, top_p, min_p, repetition_penalty, max_new_tokens"),
    (["--override-generation-config", '{"max_new_tokens": 0}'],
     "--override-generation-config: max_new_tokens must be an integer >= 1, got 0"),
    (["--override-generation-config", '{"temperature": -1}'],
     "--override-generation-config: temperature must be >= 0, got -1"),
])
def test_values_that_cannot_be_served_are_refused_by_name(argv, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _parse(*argv)


def test_max_new_tokens_caps_every_request_as_vllms_does(dirs):
    model, other = dirs
    caps = [served_defaults(_parse(*argv), model)["max_new_tokens"] for argv in (
        [], ["--generation-config", str(other)], ["--override-generation-config", '{"max_new_tokens": 3}'],
        ["--generation-config", "vllm"])]
    assert caps == [7, None, 3, None]
    assert served_defaults(_parse(), model)["default_params"].max_tokens == 7  # LLM.generate's default too
    state = ServerState(None, None, "m", 32, 100, SamplingParams(), None, max_new_tokens=5)
    # (requested, prompt length, the endpoint's default) -> max_tokens: vLLM's least of them and the context's room
    assert [state.max_tokens(*given) for given in ((None, 3, None), (8, 3, None), (None, 3, 16), (2, 3, None))] == \
        [5, 5, 5, 2]
    uncapped = ServerState(None, None, "m", 32, 100, SamplingParams(), None)
    assert [uncapped.max_tokens(*given) for given in ((None, 3, None), (8, 3, None))] == [29, 8]
    # build_app's: the flags' cap with their default_params, else the model's own generation_config.json
    llm = SimpleNamespace(model_dir=model)
    assert _max_new_tokens(llm, ServerConfig("m")) == 7
    assert _max_new_tokens(llm, ServerConfig("m", default_params=SamplingParams(), max_new_tokens=None)) is None
