"""`AsyncLLMEngine`: the engine behind an asyncio server. One background task runs the steps.

Steps run in a worker thread (they block on the device); requests are added and aborted on
the event loop and handed to the engine under a lock between steps, so concurrent callers
are batched together. A consumer that stops iterating (a client that disconnected) aborts
its request, which frees its pages.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import AsyncIterator, Sequence

from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.engine import LLMEngine
from jaxinfer.engine.outputs import RequestOutput


class AsyncLLMEngine:
    """Async front of an LLMEngine: `async for delta in engine.generate(prompt, params)`."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._lock = threading.Lock()
        self._queues: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._ids = itertools.count()
        self._loop_task: asyncio.Task | None = None
        self._wake = asyncio.Event()

    async def generate(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Deltas of one request until it finishes; invalid requests raise before the first one."""
        request_id = request_id or f"async-{next(self._ids)}"
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        with self._lock:
            self.engine.add_request(request_id, prompt, params)
        self._queues[request_id] = queue
        self._ensure_loop()
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                await self.abort(request_id)

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its pages."""
        with self._lock:
            self.engine.abort(request_id)
        self._wake.set()

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()

    async def _run(self) -> None:
        """Step while anything is in flight; sleep until the next request otherwise."""
        while True:
            if not self.engine.has_unfinished():
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                deltas = await asyncio.to_thread(self._step)
            except Exception as error:  # the engine itself failed: every waiter hears about it
                for queue in self._queues.values():
                    queue.put_nowait(error)
                raise
            for delta in deltas:
                queue = self._queues.get(delta.request_id)
                if queue is not None:
                    queue.put_nowait(delta)

    def _step(self) -> list[RequestOutput]:
        with self._lock:
            return self.engine.step()
