"""Seconds from launching `jaxinfer serve` to a healthy /health, with an empty and then a warm compile cache.

Each run gets a fresh cache home (XDG_CACHE_HOME) holding only the already built CPU kernels, so
the first start compiles every program (cold) and the second loads them from the persistent
compilation cache (warm). --checkout times another copy of jaxinfer (e.g. the main branch) the
same way, for an interleaved before/after. Writes JSON.

    python scripts/bench_serve_start.py                         # demo model, this checkout
    python scripts/bench_serve_start.py --checkout /tmp/base --runs 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KERNELS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jaxinfer" / "cpu_kernels"


def start_seconds(checkout: Path, cache_home: Path, serve_args: list[str], limit: float) -> dict:
    """One `jaxinfer serve` start: seconds to a 200 from /health, and what its log says it compiled."""
    inherited = os.environ.get("PYTHONPATH")  # e.g. where a machine's extra wheels were unpacked
    path = os.pathsep.join([str(checkout), *([inherited] if inherited else [])])
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home), "PYTHONPATH": path}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    command = [sys.executable, "-m", "jaxinfer", "serve", "--port", "0", *serve_args]
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, cwd=checkout, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
    try:
        url = None
        while time.perf_counter() - start < limit and process.poll() is None:
            if url is None and (found := re.search(r"listening on (http://\S+);", "".join(lines))):
                url = found.group(1)
            if url is not None and _healthy(url):
                log = "".join(lines)
                ready = re.search(r"(\d+) (?:step )?programs ready", log)
                return dict(seconds=time.perf_counter() - start, programs=int(ready.group(1)) if ready else None)
            time.sleep(0.2)
        return dict(seconds=None, log_tail="".join(lines)[-2000:])
    finally:
        process.terminate()
        process.wait(timeout=60)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", type=Path, default=REPO, help="the jaxinfer copy to start (default: this one)")
    parser.add_argument("--runs", type=int, default=1, help="cold + warm pairs, each with a fresh cache")
    parser.add_argument("--limit", type=float, default=3600.0, help="seconds before a start counts as failed")
    parser.add_argument("--out", type=Path, default=None)
    args, serve_args = parser.parse_known_args()
    rows = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as home:
            if KERNELS.is_dir():  # built once per machine; the XLA cache is what cold and warm differ in
                shutil.copytree(KERNELS, Path(home) / "jaxinfer" / "cpu_kernels")
            for kind in ("cold", "warm"):
                rows.append(dict(run=run, kind=kind, **start_seconds(args.checkout, Path(home), serve_args, args.limit)))
                print(json.dumps(rows[-1]), flush=True)
    out = args.out or REPO / "results" / f"bench_serve_start_{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(checkout=str(args.checkout), serve_args=serve_args, rows=rows), indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
