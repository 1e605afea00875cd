"""Every python block of README.md and docs/*.md runs as written, from a directory outside the
repository, and so do the `jaxinfer` commands of their bash blocks (pip, pytest and benchmark
lines are left to CI and the reader)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
TIMEOUT_S = 600


def code_blocks(language: str) -> list[tuple[str, str]]:
    """(file:line, code) of every fenced block in `language`, in document order."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text.count("\n", 0, match.start()) + 1
                found.append((f"{doc.name}:{line}", match.group(2)))
    return found


def jaxinfer_commands(script: str) -> list[str]:
    """The `jaxinfer ...` parts of a shell block: `a && jaxinfer x` keeps `jaxinfer x`."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        for part in line.split("&&"):
            part = part.strip()
            if part.startswith("jaxinfer "):
                commands.append(part)
    return commands


def _env() -> dict[str, str]:
    # This checkout, not whatever jaxinfer happens to be installed.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _check(result: subprocess.CompletedProcess, where: str) -> None:
    assert result.returncode == 0, f"{where} failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
    assert "Traceback" not in result.stderr, f"{where}:\n{result.stderr[-4000:]}"


PYTHON_BLOCKS = code_blocks("python")
SHELL_BLOCKS = [(where, cmds) for where, code in code_blocks("bash") if (cmds := jaxinfer_commands(code))]


def test_the_docs_have_examples_to_run():
    assert len(PYTHON_BLOCKS) >= 4 and any(w.startswith("speculative.md") for w, _ in PYTHON_BLOCKS)
    assert any("jaxinfer generate" in c for _, cmds in SHELL_BLOCKS for c in cmds)


@pytest.mark.slow
@pytest.mark.parametrize("where, code", PYTHON_BLOCKS, ids=[w for w, _ in PYTHON_BLOCKS])
def test_python_block_runs(where, code, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    _check(result, where)


@pytest.mark.slow
@pytest.mark.parametrize("where, commands", SHELL_BLOCKS, ids=[w for w, _ in SHELL_BLOCKS])
def test_jaxinfer_commands_run(where, commands, tmp_path):
    for command in commands:
        # `python -m jaxinfer` is the `jaxinfer` script of this checkout, whatever is on PATH.
        script = f"{sys.executable} -m {command}"
        result = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S
        )
        _check(result, f"{where}: {command}")
        assert result.stdout.strip(), f"{where}: {command} printed nothing"
