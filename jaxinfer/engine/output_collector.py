"""Per-request output collectors (vLLM's RequestOutputCollector) and the router that feeds them.

Every engine step returns outputs for all requests that progressed, whoever ran the step. The
router puts each into its own request's collector, where deltas not yet read merge into one;
so a stream paused while another call steps the engine resumes with all it missed. Host only.
"""

from __future__ import annotations

import asyncio
from typing import Iterable

from jaxinfer.engine.outputs import RequestOutput, accumulate


class RequestOutputCollector:
    """One request's outputs not yet read, merged into one delta; an error replaces them."""

    def __init__(self) -> None:
        self._pending: RequestOutput | BaseException | None = None
        self.ready = asyncio.Event()  # set while something is pending (async readers wait on it)

    def put(self, item: RequestOutput | BaseException) -> None:
        """Merge a delta into what is pending (an error is kept over any output)."""
        if isinstance(item, BaseException) or isinstance(self._pending, BaseException):
            self._pending = item if isinstance(item, BaseException) else self._pending
        else:
            self._pending = accumulate(self._pending, item)
        self.ready.set()

    def take(self) -> RequestOutput | None:
        """All pending output as one delta (None when nothing is pending); a failure raises."""
        item, self._pending = self._pending, None
        self.ready.clear()
        if isinstance(item, BaseException):
            raise item
        return item

    async def get(self) -> RequestOutput:
        """The next merged delta, waiting for one (async readers; the router runs on their loop)."""
        await self.ready.wait()
        item = self.take()
        assert item is not None  # ready is set only with something pending
        return item


class OutputRouter:
    """The collectors of the requests someone reads, by request id."""

    def __init__(self) -> None:
        self._collectors: dict[str, RequestOutputCollector] = {}

    def open(self, request_id: str) -> RequestOutputCollector:
        """A collector for a new request; an id already being read is an error."""
        if request_id in self._collectors:
            raise ValueError(f"request_id {request_id!r} is already in use; give each request a unique id")
        collector = self._collectors[request_id] = RequestOutputCollector()
        return collector

    def __getitem__(self, request_id: str) -> RequestOutputCollector:
        return self._collectors[request_id]

    def request_ids(self) -> list[str]:
        """The requests being read."""
        return list(self._collectors)

    def close(self, request_id: str) -> None:
        """Stop collecting a request's outputs (later ones are dropped)."""
        self._collectors.pop(request_id, None)

    def route(self, outputs: Iterable[RequestOutput]) -> set[str]:
        """Each output into its request's collector; the ids of the requests that finished."""
        finished = set()
        for output in outputs:
            collector = self._collectors.get(output.request_id)
            if collector is not None:
                collector.put(output)
            if output.finished:
                finished.add(output.request_id)
        return finished

    def fail(self, request_id: str, error: BaseException) -> None:
        """Hand one reader an error (its request could not be added)."""
        collector = self._collectors.get(request_id)
        if collector is not None:
            collector.put(error)

    def fail_all(self, error: BaseException) -> None:
        """Hand every reader an error (the engine itself failed)."""
        for collector in self._collectors.values():
            collector.put(error)
