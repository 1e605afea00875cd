"""The soak's server (scripts/soak.py): a `jaxinfer serve` child on 127.0.0.1, its RSS sampled as it runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import httpx

REPO = Path(__file__).resolve().parents[1]
READY_SECONDS = 1800  # loading and warming a model on a slow machine
RSS_EVERY = 2.0


class ServerProcess:
    """`with ServerProcess(flags, key, say) as server`: started and ready inside, killed if still alive after."""

    def __init__(self, flags: list[str], key: str, say: Callable[[str], None]):
        self.flags, self.key, self.say = flags, key, say
        self.lines: list[str] = []
        self.rss_series: list[int] = []
        self.rss_max = 0
        self.url = ""
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        # The key travels in the environment, not the command line (other users read that in `ps`).
        env = {**os.environ, "JAXINFER_API_KEY": self.key,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-m", "jaxinfer", "serve", "--host", "127.0.0.1", "--port", "0", *self.flags]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._wait_for(r"listening on (http://127\.0\.0\.1:\d+);", 300).group(1)
        self._wait_for(r"ready: serving", READY_SECONDS)
        self.say(f"server ready at {self.url} (pid {self.process.pid})")
        threading.Thread(target=self._sample_rss, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            if len(self.lines) > 2000:  # a bounded log: the soak itself must not grow
                del self.lines[:1000]

    def _wait_for(self, pattern: str, seconds: float) -> re.Match:
        deadline = time.monotonic() + seconds
        while not (match := re.search(pattern, "".join(self.lines[-200:]))):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = "".join(self.lines[-30:])
                raise RuntimeError(f"jaxinfer serve did not get to {pattern!r}:\n{tail}")
            time.sleep(0.1)
        return match

    def rss(self) -> int:
        """The server's resident set in bytes (Linux /proc)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024

    def _sample_rss(self) -> None:
        while self.process.poll() is None:
            try:
                value = self.rss()
            except (OSError, AttributeError):
                return
            self.rss_series.append(value)
            self.rss_max = max(self.rss_max, value)
            time.sleep(RSS_EVERY)

    def metrics(self) -> dict[str, float]:
        """GET /metrics, jaxinfer: samples by name."""
        text = httpx.get(self.url + "/metrics", headers={"Authorization": f"Bearer {self.key}"}, timeout=30).text
        found = re.findall(r"^jaxinfer:(\S+) (\S+)$", text, re.M)
        return {name: float(value) for name, value in found}

    def wait_idle(self, seconds: float = 120) -> None:
        """Until no request runs or waits (client aborts reach the engine a step later)."""
        deadline = time.monotonic() + seconds
        while True:
            m = self.metrics()
            if not m["num_requests_running"] and not m["num_requests_waiting"]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server kept requests for {seconds} s after the traffic ended: {m}")
            time.sleep(0.2)

    def snapshot(self) -> dict:
        """RSS, device memory, compiled programs, KV usage and queue lengths now."""
        time.sleep(1.0)  # aborted requests' last step
        m = self.metrics()
        return {"rss": self.rss(), "device": m.get("device_memory_bytes_in_use"), "compiles": m["compiled_programs_total"],
                "kv": m["kv_cache_usage_perc"], "running": m["num_requests_running"],
                "waiting": m["num_requests_waiting"]}

    def stop(self) -> int:
        """SIGTERM (a drain with nothing in flight) and the exit status."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            return -1
