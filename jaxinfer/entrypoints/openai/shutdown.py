"""Graceful shutdown of `jaxinfer serve`: SIGTERM or SIGINT stop new requests (503), let those in flight
finish for up to --shutdown-timeout seconds, then abort the rest with an error result; the process exits 0.

Signals land on the main thread (uvicorn runs on another one and takes none). While the model
loads, nothing has been served and nothing is lost, so a signal ends the process at once (exit 0)
without unwinding: an exception raised wherever the load happened to be can be dropped (jax's GC
callback), or leave an import lock held that the tokenizer's loading thread then waits on forever,
and the interpreter's exit joins that thread (a CI run hung so). Once serving, the handler only
counts the signal and the main thread, which polls, drains: a handler that took a lock could
deadlock with the code it interrupted. A second signal during the drain stops the waiting.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable

from jaxinfer.entrypoints.openai.gate import ServerStopping, Traffic

if TYPE_CHECKING:
    from jaxinfer.engine import AsyncLLMEngine

POLL_SECONDS = 0.05
ABORT_GRACE_SECONDS = 10.0  # for the aborted requests' error results to reach their clients


class StopSignals:
    """SIGTERM and SIGINT: the process ends at once until `serving` is set, then they are counted in `received`."""

    def __init__(self) -> None:
        self.serving = False
        self.received = 0

    def install(self) -> None:
        """Take both signals (only the main thread can; elsewhere, e.g. in tests, nothing changes)."""
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                signal.signal(number, self._handle)

    def _handle(self, number: int, frame: object) -> None:
        self.received += 1
        if not self.serving:
            exit_while_loading(signal.Signals(number).name)


def exit_while_loading(name: str) -> None:
    """End the process now with status 0, saying why; only raw writes (the interrupted code may hold a stream's lock)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a reentrant flush, or a closed stream: the raw write below still lands
            pass
    os.write(2, f"jaxinfer: stopped by {name} while loading; nothing was served\n".encode())
    os._exit(0)


def drain(traffic: Traffic, engine: AsyncLLMEngine, timeout: float, signals: StopSignals,
          say: Callable[[str], None]) -> int:
    """Refuse new requests, wait up to `timeout` s for those in flight, then abort the rest; how many were aborted."""
    traffic.draining = True
    received = signals.received
    say(f"stopping: {traffic.active} requests in flight, given up to {timeout:g} s (--shutdown-timeout); "
        "new requests get 503")
    _wait(lambda: traffic.active == 0 or signals.received > received, timeout)
    if traffic.active == 0 or traffic.loop is None:
        say("stopped: every request in flight finished")
        return 0
    traffic.aborting = True
    aborted = asyncio.run_coroutine_threadsafe(_abort_all(engine), traffic.loop).result(timeout=ABORT_GRACE_SECONDS)
    _wait(lambda: traffic.active == 0, ABORT_GRACE_SECONDS)
    say(f"stopped: {aborted} requests aborted with an error result after --shutdown-timeout")
    return aborted


async def _abort_all(engine: AsyncLLMEngine) -> int:
    return engine.abort_all(ServerStopping("the server is shutting down"))


def _wait(done: Callable[[], bool], seconds: float) -> bool:
    """Poll `done` until it holds or `seconds` pass; whether it held."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True
