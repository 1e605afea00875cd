"""`AsyncLLMEngine`: the engine behind an asyncio server. One background task drives the steps.

The event loop never touches the engine while a step runs (a device call, or a compile that
takes seconds): `generate` and `abort` put commands into a thread-safe inbox and return, and
the step, in a worker thread, first applies the inbox (tokenizing, validating and computing
prompt logprobs there, embeddings, and loading or removing LoRA adapters) and then runs (vLLM v1's EngineCore
input queue). Its outputs reach each
request's own collector (`output_collector`, the path `LLM` uses too). Concurrent callers are
batched together; a consumer that stops iterating (a client that disconnected) aborts its
request, which frees its pages.

Nothing here grows without bound: each request puts one Add and at most one Abort into the
inbox (the server bounds how many requests are in flight), and a collector merges the deltas
its reader has not taken yet. A step that fails outside its device call (which the engine
handles itself, failing that step's requests) fails every request in flight, and the loop
keeps serving; a reader past its deadline gets `RequestTimeout` and its request is aborted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Sequence

from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.output_collector import OutputRouter, RequestOutputCollector
from jaxinfer.engine.outputs import RequestOutput
from jaxinfer.runtime.image_input import ImageInput

if TYPE_CHECKING:
    from jaxinfer.engine.engine import LLMEngine  # the engine loads jax; its fronts only drive it

log = logging.getLogger(__name__)


class RequestTimeout(TimeoutError):
    """A request passed its deadline before finishing; it was aborted and its pages freed."""


@dataclasses.dataclass(frozen=True)
class Add:
    """Add a request (the step thread tokenizes and validates it)."""

    request_id: str
    prompt: str | Sequence[int]
    params: SamplingParams | None
    streamed: bool = False
    lora_request: LoRARequest | None = None
    images: tuple[ImageInput, ...] = ()  # a vision-language model's, over their placeholders in the prompt
    priority: int = 0  # vLLM's, under scheduling_policy "priority" (lower first)


@dataclasses.dataclass(frozen=True)
class Abort:
    """Abort a request and free its pages."""

    request_id: str


@dataclasses.dataclass(frozen=True)
class Call:
    """Run `function(engine)` in the step thread between steps; its result (or error) goes to `future`."""

    function: Callable[[LLMEngine], Any]
    future: asyncio.Future


@dataclasses.dataclass
class StepResult:
    """What one pass of the step thread hands back to the loop."""

    outputs: list[RequestOutput]
    failed: dict[str, Exception]  # requests the engine refused or a failed step took down, by id
    waiting: int  # sequences waiting for a slot after the step (the scheduler's queue)
    answers: list[tuple[asyncio.Future, Any, Exception | None]] = dataclasses.field(default_factory=list)  # Calls


class AsyncLLMEngine:
    """Async front of an LLMEngine: `async for delta in engine.generate(prompt, params)`."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._inbox: queue.SimpleQueue[Add | Abort | Call] = queue.SimpleQueue()
        self._router = OutputRouter()
        self._ids = itertools.count()
        self._loop_task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self.waiting = 0  # sequences in the scheduler's queue after the last step

    async def generate(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, request_id: str | None = None,
        deadline: float | None = None, streamed: bool = False, lora_request: LoRARequest | None = None,
        images: tuple[ImageInput, ...] = (), priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Deltas of one request until it finishes; an invalid request raises before the first one.

        deadline: the event loop's time (`loop.time()`) by which the request must finish; past it
        the request is aborted and RequestTimeout raised. streamed: its deltas go out as they come
        (see LLMEngine.add_request). lora_request: the LoRA adapter it runs with. images: the prompt's
        images over their placeholders (a vision-language model's). priority: see LLMEngine.add_request.
        """
        request_id = request_id or f"async-{next(self._ids)}"
        collector = self._router.open(request_id)
        self._send(Add(request_id, prompt, params, streamed, lora_request, images, priority))
        finished = False
        try:
            while not finished:
                delta = await _next_delta(collector, deadline)
                finished = delta.finished
                yield delta
        finally:
            self._router.close(request_id)
            if not finished:
                self._send(Abort(request_id))

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its pages (at the end of the running step)."""
        self._send(Abort(request_id))

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Read and check an adapter between steps (LLMEngine.add_lora); its errors raise here."""
        return await self._call(lambda engine: engine.add_lora(lora_request))

    async def remove_lora(self, lora: str | int) -> bool:
        """Stop serving an adapter between steps (LLMEngine.remove_lora); False when none is served so."""
        return await self._call(lambda engine: engine.remove_lora(lora))

    async def embed(self, prompts: list[list[int]], pooling: str = "last", head: Any = None) -> Any:
        """The prompts' pooled final hidden states (a NumPy array [len(prompts), D]; see LLM.embed), or with
        a classifier's head its logits [len(prompts), num_labels] (LLM.classify), computed between steps."""
        return await self._call(lambda engine: engine.runner.embed(prompts, pooling, head=head))

    async def start_profile(self) -> Path:
        """Start a device trace into $JAXINFER_PROFILER_DIR between steps; returns its directory."""
        return await self._call(lambda engine: engine.start_profile())

    async def stop_profile(self) -> Path:
        """Land the call in flight, then stop the trace and write it; returns its directory."""
        return await self._call(lambda engine: engine.stop_profile())

    async def call(self, function: Callable[[], Any]) -> Any:
        """function() in the step thread between steps, where nothing else touches the engine (an update of
        its weights, sleep); its error is raised here."""
        return await self._call(lambda engine: function())

    async def _call(self, function: Callable[[LLMEngine], Any]) -> Any:
        """function(engine) in the step thread, where the engine is only ever touched."""
        future = asyncio.get_running_loop().create_future()
        self._send(Call(function, future))
        return await future

    def abort_all(self, error: BaseException) -> int:
        """Hand every reader `error` and abort its request (a server that stops); how many there were.

        The aborts are sent here too, not left to the readers: a reader blocked elsewhere (a stream
        whose client reads slowly) would otherwise keep its request running.
        """
        request_ids = self._router.request_ids()
        for request_id in request_ids:
            self._router.fail(request_id, error)
            self._send(Abort(request_id))
        return len(request_ids)

    def _send(self, command: Add | Abort | Call) -> None:
        self._inbox.put(command)
        if self._loop_task is None or self._loop_task.done():
            self._wake = asyncio.Event()  # a fresh one: an event waited on is bound to its loop
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()

    async def _run(self) -> None:
        """Step while anything is queued or in flight; sleep until the next command otherwise."""
        while True:
            if self._inbox.empty() and not self.engine.has_unfinished():
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                result = await asyncio.to_thread(self._step)
            except Exception as error:  # the engine itself failed: every waiter hears about it
                self._router.fail_all(error)
                raise
            for future, value, error in result.answers:
                if future.done():  # its caller was cancelled
                    continue
                if error is None:
                    future.set_result(value)
                else:
                    future.set_exception(error)
            for request_id, error in result.failed.items():
                self._router.fail(request_id, error)
            self._router.route(result.outputs)
            self.waiting = result.waiting

    def _step(self) -> StepResult:
        """In the worker thread: apply the inbox, then run one step if any request is in flight."""
        failed: dict[str, Exception] = {}
        aborted: list[str] = []
        answers = []
        while not self._inbox.empty():
            command = self._inbox.get()
            if isinstance(command, Call):
                answers.append(_answer(command, self.engine))
                continue
            if isinstance(command, Abort):
                self.engine.abort(command.request_id)
                aborted.append(command.request_id)
                continue
            try:
                self.engine.add_request(command.request_id, command.prompt, command.params,
                                        streamed=command.streamed, lora_request=command.lora_request,
                                        images=command.images, priority=command.priority)
            except Exception as error:  # a bad request fails alone, at its reader
                failed[command.request_id] = error
        outputs = self.engine.finish_aborted(aborted)
        if self.engine.has_unfinished():
            try:
                outputs += self.engine.step()
            except Exception as error:  # host-side (the engine fails a device call's requests itself)
                log.exception("engine step failed outside its device call; every request in flight is failed")
                failed.update(self._fail_in_flight(error))
        return StepResult(outputs, failed, len(self.engine.scheduler.waiting), answers)

    def _fail_in_flight(self, error: Exception) -> dict[str, Exception]:
        """Abort every request the engine holds (freeing their pages), each failed with `error`.

        The step's state is unknown after such a failure, so no request is kept to retry: a loop
        that kept them would fail the same way at every step, its clients waiting forever.
        """
        request_ids = list(self.engine.groups)
        for request_id in request_ids:
            self.engine.abort(request_id)
        self.engine.finish_aborted(request_ids)
        return dict.fromkeys(request_ids, error)


def _answer(call: Call, engine: LLMEngine) -> tuple[asyncio.Future, Any, Exception | None]:
    try:
        return call.future, call.function(engine), None
    except Exception as error:  # the caller's own error: the engine goes on
        return call.future, None, error


async def _next_delta(collector: RequestOutputCollector, deadline: float | None) -> RequestOutput:
    """The collector's next delta, or RequestTimeout once the loop's clock passes `deadline`."""
    if deadline is None:
        return await collector.get()
    try:
        async with asyncio.timeout_at(deadline):
            return await collector.get()
    except TimeoutError:
        raise RequestTimeout("the request passed its deadline and was aborted") from None
