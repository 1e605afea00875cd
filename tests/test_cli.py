"""The `jaxinfer` command, run as a real subprocess."""

from __future__ import annotations

import subprocess
import sys

from jaxinfer import LLM, SamplingParams


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxinfer", *args], capture_output=True, text=True, timeout=300)


def test_generate_streams_prompt_and_completion(text_model_dir):
    result = _run("generate", "--model", str(text_model_dir), "--prompt", "def add", "--max-tokens", "12", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    expected = LLM(text_model_dir).generate("def add", SamplingParams(max_tokens=12, temperature=0, seed=0))[0]
    assert result.stdout == "def add" + expected.text + "\n"


def test_bad_arguments_exit_2_with_reason(text_model_dir):
    result = _run("generate", "--model", str(text_model_dir), "--prompt", "x", "--top-p", "0")
    assert result.returncode == 2
    assert "top_p must be in (0, 1]" in result.stderr
    missing = _run("generate", "--model", "/nonexistent/model", "--prompt", "x")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
