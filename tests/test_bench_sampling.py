"""scripts/bench_sampling.py runs and reports every stage at every batch size (tiny shapes; no timing is checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.python_subprocess import REPO, child_env


def test_bench_sampling_writes_every_stage_for_every_batch(tmp_path: Path) -> None:
    out = tmp_path / "sampling.json"
    done = subprocess.run(
        [sys.executable, "scripts/bench_sampling.py", "--rows", "1", "3", "--vocab", "2048", "--passes", "2",
         "--repeats", "1", "--probe-mb", "4", "--out", str(out)],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    stages = {"branchless", "argmax", "verify_branchless", "verify_with_conds", "verify_argmax", "sort_float", "sort_int_keys", "top_k_20",
              "top_k_16_parts"}
    assert {(row["rows"], row["stage"]) for row in report["rows"]} == {(r, s) for r in (1, 3) for s in stages}
    assert all(row["ms"] > 0 for row in report["rows"]) and report["step_ms"] > 0
