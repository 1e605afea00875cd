"""The gate every HTTP request passes: what is in flight, the queue bound, a drain for shutdown, stalled readers.

- `Admission` bounds the queue (`--max-waiting-requests`): a generation request that would wait
  past that many sequences gets 503 with Retry-After, before any work is queued for it.
- `ServingGate` (ASGI middleware) counts the requests in flight, refuses new ones with 503 once
  a shutdown began (`draining`), and gives up on a client that has not read its response for
  `write_timeout` seconds: the response stops, which aborts its request, and the step loop, which
  never waits for a client (outputs merge in per-request collectors), goes on regardless.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jaxinfer.entrypoints.openai.errors import APIError, send_error

log = logging.getLogger(__name__)
SAMPLES = "jaxinfer.admitted_samples"  # scope key: the sequences admitted for this HTTP request
RETRY_AFTER = "1"  # seconds: a queue drains by whole requests, each a second or so
STOPPING = "the server is shutting down and takes no new requests; retry on another replica or later"


class ServerStopping(Exception):
    """The server is shutting down and aborted this request after --shutdown-timeout."""


class ClientStalled(OSError):
    """The client read none of the response for write_timeout seconds (an OSError: Starlette treats it
    as a disconnect)."""


@dataclasses.dataclass
class Traffic:
    """What the gate knows of the requests, read by a shutdown in another thread (`launch`)."""

    active: int = 0  # HTTP requests being answered (health probes aside)
    draining: bool = False  # set when a shutdown begins: new requests get 503
    aborting: bool = False  # set when the shutdown aborts what is left: requests not yet started get 503
    loop: asyncio.AbstractEventLoop | None = None  # the server's loop, where the drain's aborts run


class Admission:
    """Generation requests in flight, in sequences (a request with n samples over p prompts is n * p),
    and the bound on those waiting for a slot."""

    def __init__(self, max_num_seqs: int, max_waiting: int | None, engine_waiting: Callable[[], int],
                 traffic: Traffic):
        self.max_num_seqs, self.max_waiting, self.engine_waiting = max_num_seqs, max_waiting, engine_waiting
        self.traffic = traffic
        self.samples = 0

    def waiting(self) -> int:
        """Sequences waiting: those in flight past the engine's slots, or the scheduler's queue after the
        last step (longer when pages, not slots, are short), whichever is more."""
        return max(self.samples - self.max_num_seqs, self.engine_waiting())

    def admit(self, scope: Scope, samples: int) -> None:
        """Count a request's sequences in flight, or 503 when they would wait past max_waiting behind
        others (one that finds none waiting always starts, however many samples it has: no starving).

        Checked and counted with no await between: concurrent arrivals cannot all pass one free place.
        """
        if self.traffic.aborting:  # it arrived before the shutdown but was still being tokenized
            raise APIError(STOPPING, 503, kind="service_unavailable", headers={"retry-after": RETRY_AFTER})
        waiting = self.waiting()
        after = max(self.samples + samples - self.max_num_seqs, waiting)
        if self.max_waiting is not None and waiting > 0 and after > self.max_waiting:
            raise APIError(
                f"the server is at capacity: {waiting} requests wait for a slot (--max-waiting-requests "
                f"{self.max_waiting}); retry after {RETRY_AFTER} s", 503, kind="service_unavailable",
                headers={"retry-after": RETRY_AFTER},
            )
        self.samples += samples
        scope[SAMPLES] = scope.get(SAMPLES, 0) + samples

    def release(self, scope: Scope) -> None:
        """The request's response ended: its sequences are no longer in flight."""
        self.samples -= scope.pop(SAMPLES, 0)


class ServingGate:
    """ASGI middleware over the whole app: in-flight count, drain for shutdown, write timeout."""

    def __init__(self, app: ASGIApp, traffic: Traffic, admission: Admission, write_timeout: float | None):
        self.app, self.traffic, self.admission, self.write_timeout = app, traffic, admission, write_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        traffic = self.traffic
        traffic.loop = asyncio.get_running_loop()
        if traffic.draining:
            return await _refuse(scope, send)
        # Health probes are not work to drain: a load balancer's probe arriving with the signal is
        # neither waited for nor reported as a request in flight.
        counted = int(scope["path"] != "/health")
        traffic.active += counted
        try:
            await self.app(scope, receive, self._timed(send))
        except ClientStalled as stalled:
            log.warning("%s %s: %s; its response is dropped and its request aborted", scope["method"],
                        scope["path"], stalled)
        finally:
            traffic.active -= counted
            self.admission.release(scope)

    def _timed(self, send: Send) -> Send:
        """`send` that raises ClientStalled after write_timeout seconds blocked (a full socket buffer)."""
        if self.write_timeout is None:
            return send
        timeout = self.write_timeout

        async def timed(message: Message) -> None:
            try:
                async with asyncio.timeout(timeout):
                    await send(message)
            except TimeoutError:
                raise ClientStalled(f"the client read nothing for {timeout:g} s (--write-timeout)") from None

        return timed


async def _refuse(scope: Scope, send: Send) -> None:
    """503 while the server drains; /health says so too, so a load balancer stops sending requests."""
    headers = {"retry-after": RETRY_AFTER, "connection": "close"}
    if scope["path"] == "/health":
        body = json.dumps({"status": "shutting down"}).encode()
        start_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        start_headers += [(k.encode(), v.encode()) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": 503, "headers": start_headers})
        return await send({"type": "http.response.body", "body": body})
    await send_error(send, APIError(STOPPING, 503, kind="service_unavailable", headers=headers))
