"""Building the CPU kernels: a private cache, verified libraries, no flags from the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from python_subprocess import needs_compiler

from jaxinfer.kernels.cpu import build

SOURCE = Path(build.__file__).with_name("cache_write.cc")


def test_cache_dir_is_created_private(tmp_path):
    made = build.private_dir(tmp_path / "a" / "cpu_kernels")
    assert made.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o720, 0o702])
def test_cache_dir_writable_by_others_is_refused(tmp_path, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(build.KernelBuildError, match="writable by others"):
        build.private_dir(shared)


@needs_compiler
def test_library_is_verified_by_its_digest_and_env_flags_are_ignored(tmp_path, monkeypatch):
    # A compiler or flags from the environment would fail this build; only FLAGS reach it.
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setenv("JAXINFER_CXXFLAGS", "-fno-such-flag")
    library = build.private_dir(tmp_path / "cache") / build.library_name(SOURCE, build.FLAGS)
    assert not build.verified(library)
    build.compile_library(SOURCE, library, build.FLAGS)
    assert build.verified(library)
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a library changed after its build must not be loaded
    library.write_bytes(bytes(data))
    assert not build.verified(library)


def run_without_compiler(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`script` in a fresh interpreter whose PATH has no compiler (and a fresh kernel cache)."""
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin"), "JAXINFER_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("JAXINFER_CPU_KERNELS", None)
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)


def test_missing_compiler_is_one_log_line_and_the_xla_path(tmp_path):
    script = (
        "from jaxinfer import LLM, SamplingParams\n"
        "llm = LLM(dtype='bfloat16', max_seq_len=64)\n"
        "llm.generate('def f', SamplingParams(max_tokens=2))\n"
        "print(llm.cpu_kernels)\n"
    )
    out = run_without_compiler(script, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
    lines = [line for line in out.stderr.splitlines() if "compiler" in line or "CPU kernel" in line]
    said = "no C++ compiler (g++ or clang++) on PATH: jaxinfer's CPU kernels are off, XLA's ops run instead"
    # On a GPU or TPU the kernels are never wanted, so a missing compiler is not worth a line.
    assert lines == ([said] if jax.default_backend() == "cpu" else [])


def test_asking_for_kernels_without_a_compiler_fails_clearly(tmp_path):
    out = run_without_compiler("from jaxinfer import LLM\nLLM(dtype='bfloat16', max_seq_len=64, cpu_kernels=True)\n", tmp_path)
    assert out.returncode != 0
    assert "cpu_kernels=True, but the native CPU kernels cannot run here" in out.stderr
