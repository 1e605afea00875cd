"""Broken model directories (issue 45): one error line naming the path and what is expected, a
ValueError subclass from the API and exit 2 from the CLI; `convert` into a non-empty directory
is refused unless --overwrite."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import jax.numpy as jnp
import pytest
from python_subprocess import child_env

from jaxinfer import LLM, CheckpointError, ConfigError, load_weights, save_converted
from jaxinfer.checkpoint.converted import ORBAX_SUBDIR

HUB_ID = "meta-llama/Llama-3.2-1B"
Broken = Callable[[Path, Path], tuple[str, list[str]]]  # (good checkpoint, scratch dir) -> (model, needles)


def _copy(good: Path, tmp: Path) -> Path:
    return Path(shutil.copytree(good, tmp / "model"))


def _config_not_json(good: Path, tmp: Path) -> tuple[str, list[str]]:
    path = _copy(good, tmp)
    (path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],')
    return str(path), [str(path / "config.json"), "not valid JSON", "line 1"]


def _config_without_hidden_size(good: Path, tmp: Path) -> tuple[str, list[str]]:
    path = _copy(good, tmp)
    config = json.loads((path / "config.json").read_text())
    del config["hidden_size"]
    (path / "config.json").write_text(json.dumps(config))
    return str(path), [str(path / "config.json"), "hidden_size"]


def _truncated_weights(good: Path, tmp: Path) -> tuple[str, list[str]]:
    path = _copy(good, tmp)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    return str(path), [str(path / "model.safetensors"), "complete safetensors file"]


def _file_not_directory(good: Path, tmp: Path) -> tuple[str, list[str]]:
    path = _copy(good, tmp)
    return str(path / "config.json"), [f"{path / 'config.json'} is a file", "directory", str(path)]


def _hub_id(good: Path, tmp: Path) -> tuple[str, list[str]]:
    return HUB_ID, [repr(HUB_ID), "not a local directory", f"huggingface-cli download {HUB_ID}"]


BROKEN: dict[str, Broken] = {
    "config.json not JSON": _config_not_json,
    "config.json without hidden_size": _config_without_hidden_size,
    "truncated model.safetensors": _truncated_weights,
    "a file instead of a directory": _file_not_directory,
    "a hub id": _hub_id,
}


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jaxinfer", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=child_env()
    )


def _one_line(stderr: str, needles: list[str]) -> None:
    """The CLI's user-error shape: exactly one line, no traceback, naming every needle."""
    assert stderr.startswith("jaxinfer: error: ") and stderr.count("\n") == 1, stderr
    for needle in needles:
        assert needle in stderr, f"{needle!r} not in {stderr!r}"


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_model_is_one_value_error_naming_the_path(case, checkpoint_dir, tmp_path, monkeypatch):
    model, needles = BROKEN[case](checkpoint_dir("llama2"), tmp_path)
    monkeypatch.chdir(tmp_path)  # a hub id is a relative path: make sure none is here
    with pytest.raises(ValueError) as info:
        LLM(model, dtype="float32")
    assert isinstance(info.value, (CheckpointError, ConfigError)), repr(info.value)
    message = str(info.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


@pytest.mark.parametrize("case", list(BROKEN))
def test_cli_broken_model_exits_2_with_one_line(case, checkpoint_dir, tmp_path):
    model, needles = BROKEN[case](checkpoint_dir("llama2"), tmp_path)
    result = _cli(tmp_path, "generate", "--model", model, "--prompt", "x", "--max-tokens", "2")
    assert result.returncode == 2, result.stderr
    _one_line(result.stderr, needles)


def test_convert_refuses_a_non_empty_out_dir_unless_overwrite(text_model_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "tokenizer.model").write_text("a stale file of an earlier convert")
    convert = ("convert", str(text_model_dir), str(out), "--dtype", "float32")
    refused = _cli(tmp_path, *convert)
    assert refused.returncode == 2, refused.stderr
    _one_line(refused.stderr, [f"OUT_DIR {out}", "not empty", "--overwrite"])
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "tokenizer.model"]  # nothing written
    written = _cli(tmp_path, *convert, "--overwrite")
    assert written.returncode == 0, written.stderr
    assert (out / ORBAX_SUBDIR).is_dir() and (out / "notes.txt").read_text() == "mine"
    assert not (out / "tokenizer.model").exists()  # what convert writes is replaced, not mixed with the old


def test_save_converted_refuses_a_non_empty_out_dir_unless_overwrite(checkpoint_dir, tmp_path):
    src = checkpoint_dir("llama2")
    _, weights = load_weights(src, jnp.float32, progress=False)
    out = tmp_path / "out"
    save_converted(weights, src, out)
    with pytest.raises(CheckpointError, match=rf"out_dir {out} is not empty.*overwrite=True"):
        save_converted(weights, src, out)
    assert save_converted(weights, src, out, overwrite=True) == out
