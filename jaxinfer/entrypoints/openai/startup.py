"""A server's start: the port bound first, then the model loaded and compiled while the port answers.

Loading and compiling take minutes on an accelerator. Binding first makes a taken port an
error at once, and a client or orchestrator polling `/health` reads 503 "warming up" (with the
phase and how many step programs are compiled) until the real app takes over.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from jaxinfer.entrypoints.openai.errors import error_body
from jaxinfer.entrypoints.openai.http_middleware import without_prefix

BACKLOG = 2048  # uvicorn's default


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; a taken port or a bad address is a ValueError naming --port/--host."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a restart may rebind at once
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as error:
        sock.close()
        reason = error.strerror or str(error)
        raise ValueError(
            f"--host {host} --port {port}: cannot listen there ({reason}); choose another --port "
            "(0 picks a free one) or stop the process that holds it"
        ) from None
    return sock


class StartingApp:
    """The ASGI app until the model is ready: /health is 503 with the start's progress, other routes
    503 with an OpenAI error body; `ready(app)` hands every later request to the real app. Under --root-path
    `root_path`, /health answers at the prefixed path too, as the real app's routes do (http_middleware.RootPath)."""

    def __init__(self, log=sys.stderr, root_path: str = ""):
        self.app: ASGIApp | None = None
        self.root_path = root_path
        self.status: dict = {"status": "warming up", "phase": "starting"}
        self.log, self.started = log, time.monotonic()
        self._lock = threading.Lock()  # the loading thread writes what the server thread reads
        self._printed = -1

    def phase(self, name: str, note: str = "") -> None:
        """A new phase of the start, printed (with the note) and shown by /health."""
        with self._lock:
            self.status = {"status": "warming up", "phase": name}
        self.say(f"{name} ({note})" if note else name)

    def compiled(self, done: int, total: int) -> None:
        """Warm-up progress; printed at every tenth of the programs (a log file gets no progress bar)."""
        with self._lock:
            self.status = {"status": "warming up", "phase": "compiling programs", "done": done, "total": total}
        tenth = 10 * done // max(total, 1)
        if tenth > self._printed:
            self._printed = tenth
            self.say(f"compiled {done}/{total} programs")

    def ready(self, app: ASGIApp) -> None:
        """Serve with `app` from now on."""
        self.app = app

    def say(self, message: str) -> None:
        """One progress line with the seconds since the start."""
        print(f"jaxinfer: [{time.monotonic() - self.started:6.1f}s] {message}", file=self.log, flush=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.app is not None:
            return await self.app(scope, receive, send)
        if scope["type"] != "http":
            return  # no websockets, and uvicorn runs this app without lifespan events
        with self._lock:
            status = dict(self.status)
        path = scope["path"]
        if "/health" in (path, without_prefix(path, self.root_path)):
            body = status
        else:
            detail = status["phase"] + (f" {status['done']}/{status['total']}" if "done" in status else "")
            message = f"the server is warming up ({detail}); retry when GET /health answers 200"
            body = error_body(message, "service_unavailable", None, 503)
        payload = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                   (b"retry-after", b"5")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
