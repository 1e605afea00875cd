"""scripts/gpu_session.sh's commands are well formed: a GPU sitting is 15 minutes, rare, and a mode that
dies on a misspelt flag spends it. Every mode runs here with a stand-in `python3` that only records its
arguments; each recorded command is then checked without running it: a script's own parser accepts its
flags, `jaxinfer`'s parser accepts the CLI's, and the test files pytest is given exist."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.python_subprocess import REPO, child_env

SESSION = Path(REPO) / "scripts" / "gpu_session.sh"
# Records one call's arguments (each ended by \x1f: `-c` snippets hold newlines) in a file of its own, and
# succeeds, so the modes' readiness checks pass. A file per call: `serving` starts a server in the
# background while its readiness check runs, and two calls appending to one file interleaved there.
RECORDING_PYTHON = """#!/usr/bin/env bash
printf '%s\\037' "$@" > "$(mktemp "$GPU_SESSION_CALLS/call.XXXXXXXX")"
"""


def session_modes() -> list[list[str]]:
    """Each mode of the script with the arguments it needs before OUT_DIR."""
    modes = re.findall(r"(?m)^([a-z0-9-]+)\)$", SESSION.read_text())
    return [[mode, *(["1"] if mode == "suite" else [])] for mode in modes] + [["suite", "2"]]


def recorded_calls(tmp_path: Path) -> list[list[str]]:
    """Every `python3` call the modes make, run from a copy of the script beside a link to tests/ (so
    its writes land in tmp_path, and `results/pair_gpu` looks trained for spec-pair)."""
    root, bin_dir = tmp_path / "checkout", tmp_path / "bin"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "gpu_session.sh").write_text(SESSION.read_text())
    (root / "tests").symlink_to(Path(REPO) / "tests")
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(RECORDING_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    calls = tmp_path / "calls"
    calls.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GPU_SESSION_CALLS": str(calls)}
    for mode in session_modes():
        (root / "results" / "pair_gpu" / "eagle").mkdir(parents=True, exist_ok=True)  # train-pair replaces it
        done = subprocess.run(["bash", str(root / "scripts" / "gpu_session.sh"), *mode, str(tmp_path / "out")],
                              env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, (mode, done.stdout[-2000:], done.stderr[-2000:])
    return [call.read_text().split("\x1f")[:-1] for call in calls.iterdir()]


def parse_problems(commands: list[list[str]]) -> list[str]:
    """What each command's parser rejects, checked in a child interpreter run from the checkout."""
    checked = subprocess.run([sys.executable, "-m", "tests.script_flags"], input=json.dumps(commands),
                             env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert checked.returncode == 0, checked.stderr[-3000:]
    return json.loads(checked.stdout.splitlines()[-1])


def test_every_mode_calls_scripts_and_the_cli_with_flags_they_accept(tmp_path: Path) -> None:
    calls = recorded_calls(tmp_path)
    scripts = [argv for argv in calls if argv[0].startswith("scripts/")]
    cli = [argv for argv in calls if argv[:2] == ["-m", "jaxinfer"]]
    assert len(scripts) >= 30 and len(cli) >= 2, calls
    assert parse_problems(scripts + cli) == []


def test_every_test_file_a_mode_names_exists(tmp_path: Path) -> None:
    named = [arg for argv in recorded_calls(tmp_path) if argv[:2] == ["-m", "pytest"] for arg in argv
             if arg.endswith(".py")]
    assert named, "no mode runs pytest on named files"
    assert [path for path in named if not (Path(REPO) / path).is_file()] == []


def test_the_check_catches_flags_a_parser_rejects() -> None:
    problems = parse_problems([["scripts/count_programs.py", "--no-such-flag"],
                               ["-m", "jaxinfer", "serve", "--model", "m", "--no-such-flag"]])
    assert len(problems) == 2 and all("--no-such-flag" in problem for problem in problems), problems
