"""Run a snippet in a fresh interpreter: kernel builds and fallbacks are decided once per process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import jax
import pytest

on_cpu_backend = pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="jaxinfer's native kernels serve the CPU backend only"
)
needs_compiler = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("clang++") is None,
    reason="no C++ compiler (g++ or clang++) on PATH to build the CPU kernels",
)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(*first: str, **extra: str) -> dict[str, str]:
    """This environment for a child interpreter that imports this checkout (after `first` paths), keeping
    whatever PYTHONPATH already holds (a machine may keep needed packages there)."""
    path = os.pathsep.join(filter(None, [*first, REPO, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def python_child(script: str, timeout: float | None = None, **env: str) -> subprocess.CompletedProcess:
    """`script` run to its end in a fresh interpreter on this checkout (output captured as text, any exit
    status; subprocess.TimeoutExpired past `timeout` seconds)."""
    return subprocess.run([sys.executable, "-c", script], env=child_env(**env), capture_output=True, text=True,
                          check=False, timeout=timeout)


def run_python(script: str, kernels: bool = True, **env: str) -> str:
    """Stdout of `script` with the CPU kernels on or off and any extra environment variables."""
    out = python_child(script, JAXINFER_CPU_KERNELS="1" if kernels else "0", **env)
    assert out.returncode == 0, f"subprocess failed:\n{out.stderr[-3000:]}"
    return out.stdout.strip()
