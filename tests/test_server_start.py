"""`jaxinfer serve` starting up: the port bound before anything slow, /health 503 while warming up."""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
from python_subprocess import child_env

from jaxinfer.entrypoints.openai.startup import StartingApp

# Knobs that leave a handful of step programs to compile (a few seconds from the compile cache).
TINY = ["--max-model-len", "32", "--max-num-seqs", "1", "--max-num-batched-tokens", "16", "--decode-steps", "1"]


def test_a_taken_port_fails_before_the_model_loads(text_model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "jaxinfer", "serve", "--model", str(text_model_dir), "--port", str(port), *TINY]
        done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"--port {port}" in done.stderr and "in use" in done.stderr and "loading" not in done.stderr


class Lines:
    """A child's stderr lines, read as they come."""

    def __init__(self, stream):
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(stream), daemon=True).start()

    def wait_for(self, pattern: str, process: subprocess.Popen, timeout: float = 120) -> re.Match:
        deadline = time.monotonic() + timeout
        while not (match := re.search(pattern, "".join(self.lines))):
            assert process.poll() is None and time.monotonic() < deadline, "".join(self.lines)
            time.sleep(0.05)
        return match


def test_health_is_503_warming_up_until_the_model_is_ready(text_model_dir):
    command = [sys.executable, "-m", "jaxinfer", "serve", "--model", str(text_model_dir), "--port", "0", *TINY]
    process = subprocess.Popen(command, env=child_env(), stderr=subprocess.PIPE, text=True)
    try:
        stderr = Lines(process.stderr)
        url = stderr.wait_for(r"listening on (http://\S+);", process).group(1)
        first = httpx.get(url + "/health", timeout=10)  # the model is still loading: jax alone takes seconds
        assert first.status_code == 503 and first.json()["status"] == "warming up", first.text
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        statuses = []
        while (health := httpx.get(url + "/health", timeout=10)).status_code == 503:
            statuses.append(health.json())
            try:  # a request before the end of the warm-up is refused, not queued
                client.completions.create(model=text_model_dir.name, prompt="x", max_tokens=1)
                assert httpx.get(url + "/health", timeout=10).status_code == 200  # ready in between: served
            except openai.APIStatusError as error:
                assert error.status_code == 503 and "warming up" in error.message
            time.sleep(0.05)
        assert health.status_code == 200 and statuses
        stderr.wait_for(r"ready: serving", process)  # its line may trail the first 200 by a moment
        log = "".join(stderr.lines)
        count = int(re.search(r"(\d+) programs ready", log).group(1))
        assert f"compiled {count}/{count} programs" in log and "ready: serving" in log, log
        assert len(client.completions.create(model=text_model_dir.name, prompt="x", max_tokens=2).choices) == 1
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0


def _get(app: StartingApp, path: str) -> tuple[int, dict]:
    """(status, JSON body) of a GET `path` answered by `app`."""
    sent = []

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app({"type": "http", "method": "GET", "path": path, "headers": []}, None, send))
    return sent[0]["status"], json.loads(sent[1]["body"])


def test_health_answers_its_warm_up_status_under_the_root_path_too():
    app = StartingApp(io.StringIO(), root_path="/api")
    answers = [_get(app, path) for path in ("/health", "/api/health", "/api2/health", "/api/v1/models")]
    assert [status for status, _ in answers] == [503] * 4
    assert [body.get("status") for _, body in answers] == ["warming up", "warming up", None, None]
    assert "warming up" in answers[3][1]["error"]["message"]
