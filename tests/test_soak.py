"""scripts/soak.py on the tiny model: a real `jaxinfer serve` under mixed traffic and faults loses no request,
returns its pages, answers greedy requests as LLM.generate does, and exits 0.

The warm-up sends every kind of request twice (the whole mix, with its disconnects, aborts and timeouts) before
the timed traffic; a leak or a lost request shows in the end state of any of them, so the timed phase needs
enough requests for each outcome to come up (~60 in 10 s on the loaded 2-core VM), not a minute.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from python_subprocess import REPO, child_env

SOAK = Path(REPO) / "scripts" / "soak.py"


@pytest.mark.slow
def test_mixed_traffic_loses_nothing_and_leaks_nothing(text_model_dir, tmp_path):
    report_path = tmp_path / "soak.json"
    command = [sys.executable, str(SOAK), "--model", str(text_model_dir), "--duration", "10", "--warm-seconds", "5",
               "--skip-warmup", "--greedy-samples", "8", "--output", str(report_path)]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=1200, check=False)
    assert report_path.exists(), done.stderr[-4000:]
    report = json.loads(report_path.read_text())
    failed = {name: check for name, check in report["checks"].items() if not check["passed"]}
    assert done.returncode == 0 and not failed, (failed, report["problems"], done.stderr[-4000:])
    results = report["results"]
    assert results.get("lost", 0) == 0 and results.get("unexpected", 0) == 0
    # The traffic reached the server's paths: answers, refusals, hang-ups and a loaded queue.
    assert results["ok"] > 10 and results["rejected"] > 0, results
    assert report["greedy"]["compared"] > 0
    assert report["server"]["kv_cache_usage_perc"] == 0
