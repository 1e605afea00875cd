"""`SyncLLMEngine`: the blocking front of an LLMEngine, for callers in one thread (what `LLM` uses).

Whoever waits for output runs the next step, and every step's outputs go to their own requests'
collectors (`output_collector`): two streams advanced in turns, or a `generate` called while a
stream is paused, each get all of their own text. Aborting finishes only the aborted requests.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.output_collector import OutputRouter
from jaxinfer.engine.outputs import RequestOutput
from jaxinfer.runtime.image_input import ImageInput

if TYPE_CHECKING:
    from jaxinfer.engine.engine import LLMEngine  # the engine loads jax; its fronts only drive it


class SyncLLMEngine:
    """add / run / stream / abort over one LLMEngine, each request read through its own collector."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.router = OutputRouter()
        self._ids = itertools.count()

    def add(self, prompts: Sequence[str | Sequence[int]], params: Sequence[SamplingParams], final_only: bool,
            streamed: bool = False, lora_requests: Sequence[LoRARequest | None] | None = None,
            images: Sequence[Sequence[ImageInput]] | None = None,
            priorities: Sequence[int] | None = None) -> list[str]:
        """Queue all requests, or none: an invalid one aborts those queued before it and raises
        (final_only, streamed, each prompt's lora_request, images and priority: see LLMEngine.add_request)."""
        added: list[str] = []
        adapters = lora_requests or [None] * len(prompts)
        pictures = images or [()] * len(prompts)
        ranks = priorities or [0] * len(prompts)
        try:
            for prompt, p, adapter, image, rank in zip(prompts, params, adapters, pictures, ranks):
                request_id = f"llm-{next(self._ids)}"
                self.router.open(request_id)
                added.append(request_id)
                self.engine.add_request(request_id, prompt, p, final_only=final_only, streamed=streamed,
                                        lora_request=adapter, images=image, priority=rank)
        except Exception:
            self.abort(added)
            raise
        return added

    def run(self, request_ids: list[str], on_finished: Callable[[int], object] | None = None) -> list[RequestOutput]:
        """Step until these requests finish; their final outputs in order. An exception (Ctrl-C in a
        notebook too) aborts them, so the next call does not run them to the end first.

        on_finished(count) hears how many of them finished after each step (a progress bar).
        """
        remaining = set(request_ids)
        try:
            while remaining:
                done = remaining & self.step()
                remaining -= done
                if done and on_finished is not None:
                    on_finished(len(done))
            return [self._final(request_id) for request_id in request_ids]
        except BaseException:
            self.abort(request_ids)
            raise

    def stream(self, request_id: str) -> Iterator[RequestOutput]:
        """The request's deltas (all it missed merged into one); closing the iterator early aborts it."""
        collector, finished = self.router[request_id], False
        try:
            while not finished:
                delta = collector.take()
                if delta is None:
                    self.step()
                    continue
                finished = delta.finished
                yield delta
        finally:
            self.abort([request_id])  # a finished one is only forgotten; a running one frees its pages

    def step(self) -> set[str]:
        """One engine step, its outputs routed to their collectors; the ids of requests that finished."""
        if not self.engine.has_unfinished():
            raise RuntimeError("the engine holds no requests but outputs are awaited; was it stepped elsewhere?")
        return self.router.route(self.engine.step())

    def abort(self, request_ids: list[str]) -> None:
        """Abort these requests (finished ones are left as they are) and forget their outputs; others keep running."""
        for request_id in request_ids:
            self.engine.abort(request_id)
        self.engine.finish_aborted(request_ids)
        for request_id in request_ids:
            self.router.close(request_id)

    def _final(self, request_id: str) -> RequestOutput:
        output = self.router[request_id].take()
        self.router.close(request_id)
        assert output is not None and output.finished
        return output
