"""The `jaxinfer` command, run as a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from python_subprocess import child_env

from jaxinfer import LLM, SamplingParams, __version__

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = child_env(*env.pop("extra_path", []), **env)
    return subprocess.run(
        [sys.executable, "-m", "jaxinfer", *args], capture_output=True, text=True, timeout=300, env=full_env
    )


def test_generate_streams_prompt_and_completion(text_model_dir):
    result = _run(
        "generate", "--model", str(text_model_dir), "--prompt", "def add", "--max-tokens", "12", "--temperature", "0"
    )
    assert result.returncode == 0, result.stderr
    expected = LLM(text_model_dir).generate("def add", SamplingParams(max_tokens=12, temperature=0, seed=0))[0]
    assert result.stdout == "def add" + expected.text + "\n"


def test_generate_saves_the_prompts_session(text_model_dir, tmp_path):
    prompt = "a b c " * 5 + "a b"  # 22 tokens: one whole page
    result = _run("generate", "--model", str(text_model_dir), "--prompt", prompt, "--max-tokens", "2",
                  "--save-session", str(tmp_path / "session"))
    assert result.returncode == 0 and "saved the KV of 16 of the prompt's 22 tokens" in result.stderr, result.stderr
    assert LLM(text_model_dir).load_session(tmp_path / "session").pages_written == 1
    again = _run("generate", "--model", str(text_model_dir), "--prompt", prompt, "--max-tokens", "2",
                 "--save-session", str(tmp_path / "session"))
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "is not empty" in again.stderr, again.stderr


def test_bad_arguments_exit_2_with_reason(text_model_dir):
    result = _run("generate", "--model", str(text_model_dir), "--prompt", "x", "--top-p", "0")
    assert result.returncode == 2
    assert "top_p must be in (0, 1]" in result.stderr
    missing = _run("generate", "--model", "/nonexistent/model", "--prompt", "x")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    overflow = _run("generate", "--prompt", "x", "--top-k", str(2**40))
    assert overflow.returncode == 2 and "Traceback" not in overflow.stderr and "top_k" in overflow.stderr
    memory = _run("serve", "--gpu-memory-utilization", "1.5")  # checked before anything loads
    assert memory.returncode == 2 and "--gpu-memory-utilization: 1.5 is not in (0, 1]" in memory.stderr


def test_too_long_prompt_is_one_line_and_no_echo():
    result = _run("generate", "--prompt", "x = 1\n" * 400)
    assert result.returncode == 2
    assert result.stdout == ""  # the prompt is echoed only once it was accepted
    assert result.stderr.count("\n") == 1 and "exceeds max_seq_len 1024" in result.stderr, result.stderr


def test_no_pytorch_advisory_without_torch(tmp_path):
    # torch is not a dependency: transformers' import-time "PyTorch was not found" is noise to users.
    (tmp_path / "sitecustomize.py").write_text('import sys\nsys.modules["torch"] = None\n')
    result = _run("generate", "--prompt", "def f", "--max-tokens", "2", extra_path=[str(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr


def test_version_and_help_show_the_api_defaults():
    assert _run("--version").stdout.strip() == f"jaxinfer {__version__}"
    help_text = " ".join(_run("generate", "--help").stdout.split())
    defaults = SamplingParams()
    assert f"--max-tokens MAX_TOKENS tokens to generate (default: {defaults.max_tokens})" in help_text
    assert f"0 = greedy (default: {defaults.temperature})" in help_text


def test_generate_with_quantized_weights_and_cache(text_model_dir):
    flags = ("--quantization", "int8", "--kv-cache-dtype", "int8")
    result = _run("generate", "--model", str(text_model_dir), "--prompt", "def add", "--max-tokens", "8", "--temperature", "0", *flags)
    assert result.returncode == 0, result.stderr
    llm = LLM(text_model_dir, quantization="int8", kv_cache_dtype="int8")
    assert result.stdout == "def add" + llm.generate("def add", SamplingParams(max_tokens=8, temperature=0))[0].text + "\n"
    bad = _run("generate", "--prompt", "x", "--quantization", "int3")
    assert bad.returncode == 2 and "--quantization" in bad.stderr and "int4" in bad.stderr
