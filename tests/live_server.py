"""Servers for tests, started for real: an app over an in-process LLM on a uvicorn thread (faults are
injected by monkeypatching its engine), or a `jaxinfer serve` child process (signals, logs)."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import uvicorn
from python_subprocess import child_env

from jaxinfer.entrypoints.openai import ServerConfig, build_app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(llm, config: ServerConfig, send_buffer: int | None = None) -> Iterator[tuple[str, object]]:
    """(base URL, app) of `build_app(llm, config)` served on a free localhost port until the block ends.

    send_buffer: the kernel's send buffer of each connection in bytes (default: Linux's, which grows to
    megabytes), for tests of clients that stop reading.
    """
    app = build_app(llm, config)
    sock = socket.socket()
    if send_buffer is not None:  # accepted connections inherit it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def metrics(base_url: str, key: str | None = None) -> dict[str, float]:
    """The jaxinfer: samples of GET /metrics by name (labels included)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    values = {}
    for line in httpx.get(base_url + "/metrics", headers=headers, timeout=30).text.splitlines():
        match = re.match(r"^(jaxinfer:[^ ]+) ([0-9.e+-]+)$", line)
        if match:
            values[match.group(1)] = float(match.group(2))
    return values


def wait_until_idle(engine, seconds: float = 30) -> None:
    """Wait for the engine to hold no request (their pages freed)."""
    deadline = time.monotonic() + seconds
    while engine.has_unfinished() or engine.blocks.usage:
        assert time.monotonic() < deadline, "the engine kept requests or pages"
        time.sleep(0.05)


class Lines:
    """A child's output lines, read as they come."""

    def __init__(self, stream):
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(stream), daemon=True).start()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, process: subprocess.Popen, timeout: float = 180) -> re.Match:
        deadline = time.monotonic() + timeout
        while not (match := re.search(pattern, self.text)):
            assert process.poll() is None and time.monotonic() < deadline, self.text
            time.sleep(0.05)
        return match


PLUGINS = Path(__file__).parent / "plugins"


def start_serve(flags: list[str], plugin: str | None = None, **env: str) -> tuple[subprocess.Popen, Lines, str]:
    """A `jaxinfer serve` child with `flags` on a free port: (process, its output lines, base URL once listening).

    plugin: a module of tests/plugins/ the child imports first (a test-only fault or delay); env: more
    environment variables.
    """
    prelude = f"import {plugin}; " if plugin else ""
    code = f"{prelude}import sys; from jaxinfer.entrypoints.cli import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", code, "serve", "--port", "0", *flags]
    process = subprocess.Popen(command, env=child_env(str(PLUGINS), **env), stderr=subprocess.STDOUT,
                               stdout=subprocess.PIPE, text=True)
    lines = Lines(process.stdout)
    url = lines.wait_for(r"listening on (https?://\S+);", process).group(1)
    return process, lines, url


def wait_ready(process: subprocess.Popen, lines: Lines, timeout: float = 300) -> None:
    """Wait for the child's model to be loaded and warmed."""
    lines.wait_for(r"ready: serving", process, timeout)
