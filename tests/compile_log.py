"""What each test compiles, for finding where a cold suite's time goes (opt-in, a pytest plugin).

`JAXINFER_TESTS_COMPILE_LOG=DIR pytest ...` writes one JSON line per test to DIR/<worker>.jsonl:
its XLA compiles (programs not in the persistent cache: name and seconds) and its cache hits.
A program many tests compile under different shapes is one a shared test configuration would
compile once; `python tests/compile_log.py DIR` prints each worker's time and the compile totals by test file and
by program.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import time
from pathlib import Path

import pytest

LOG_VAR = "JAXINFER_TESTS_COMPILE_LOG"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
RETRIEVAL_EVENT = "/jax/compilation_cache/cache_retrieval_time_sec"


class _Recorder(logging.Handler):
    """Collects the current test's compiles from jax's cache log lines and duration events."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.misses: list[str] = []
        self.hits = 0
        self.compile_seconds: list[float] = []
        self.retrieval_seconds = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.msg if isinstance(record.msg, str) else ""
        if message.startswith("PERSISTENT COMPILATION CACHE MISS"):
            self.misses.append(str(record.args[0]))
        elif message.startswith("Persistent compilation cache hit"):
            self.hits += 1

    def on_duration(self, event: str, seconds: float, **_: object) -> None:
        if event == COMPILE_EVENT:
            self.compile_seconds.append(seconds)
        elif event == RETRIEVAL_EVENT:
            self.retrieval_seconds += seconds

    def take(self) -> dict:
        entry = {"misses": self.misses, "hits": self.hits,  # compile_s includes retrieval_s (cache hits)
                 "compile_s": round(sum(self.compile_seconds), 3),
                 "compiles": len(self.compile_seconds), "retrieval_s": round(self.retrieval_seconds, 3)}
        self.__init__()
        return entry


def pytest_configure(config: pytest.Config) -> None:
    directory = os.environ.get(LOG_VAR)
    if not directory:
        return
    import jax.monitoring

    recorder = _Recorder()
    logger = logging.getLogger("jax._src.compiler")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(recorder)
    jax.monitoring.register_event_duration_secs_listener(recorder.on_duration)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    config.pluginmanager.register(_PerTest(recorder, Path(directory) / f"{worker}.jsonl"), "compile_log")


class _PerTest:
    def __init__(self, recorder: _Recorder, path: Path):
        self.recorder, self.path = recorder, path
        path.parent.mkdir(parents=True, exist_ok=True)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item):
        self.recorder.take()
        start = time.perf_counter()
        yield
        wall = round(time.perf_counter() - start, 3)
        with self.path.open("a") as out:
            out.write(json.dumps({"test": item.nodeid, "wall_s": wall, **self.recorder.take()}) + "\n")


def report(directory: Path) -> None:
    """Compile seconds by test file, and the programs compiled under the most distinct keys."""
    entries = [json.loads(line) for path in directory.glob("*.jsonl") for line in path.read_text().splitlines()]
    for path in sorted(directory.glob("*.jsonl")):
        walls = [json.loads(line).get("wall_s", 0) for line in path.read_text().splitlines()]
        print(f"{path.stem}: {sum(walls):.0f} s in {len(walls)} tests")
    by_file: collections.Counter = collections.Counter()
    programs: collections.Counter = collections.Counter()
    for entry in entries:
        by_file[entry["test"].split("::")[0]] += entry["compile_s"] - entry["retrieval_s"]
        programs.update(entry["misses"])
    compiled = sum(e["compile_s"] - e["retrieval_s"] for e in entries)
    print(f"{compiled:.0f} s compiling {sum(len(e['misses']) for e in entries)} programs, "
          f"{sum(e['hits'] for e in entries)} loaded from the cache")
    for name, seconds in by_file.most_common(30):
        print(f"{seconds:8.1f} s  {name}")
    for name, count in programs.most_common(30):
        print(f"{count:6d} misses  {name}")


if __name__ == "__main__":
    report(Path(sys.argv[1]))
