"""What the endpoints share: the server state, prompt checks, and running requests on the async engine."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from typing import Any, AsyncIterator, Sequence

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from jaxinfer.config import validation
from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine import AsyncLLMEngine, RequestOutput
from jaxinfer.engine.asleep import EngineAsleep
from jaxinfer.engine.async_engine import RequestTimeout
from jaxinfer.engine.outputs import accumulate
from jaxinfer.engine.prompt_checks import check_priority, check_prompt
from jaxinfer.entrypoints.openai.errors import APIError, error_body
from jaxinfer.entrypoints.openai.gate import Admission, ServerStopping
from jaxinfer.entrypoints.openai.limits import Limits
from jaxinfer.entrypoints.openai.reasoning import ReasoningParser
from jaxinfer.entrypoints.openai.request_log import RequestLog
from jaxinfer.entrypoints.openai.tool_parsers import ToolParser


@dataclasses.dataclass
class ServerState:
    """One model behind one async engine, and the facts the endpoints check requests against."""

    engine: AsyncLLMEngine
    tokenizer: Any | None
    model_name: str
    max_seq_len: int
    vocab_size: int
    default_params: SamplingParams
    admission: Admission
    limits: Limits = Limits()
    request_timeout: float | None = None  # --request-timeout
    max_new_tokens: int | None = None  # the generation config's: caps every request's max_tokens (vLLM's)
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    adapters: dict[str, LoRARequest] = dataclasses.field(default_factory=dict)  # --lora-modules, by name
    reasoning_parser: ReasoningParser | None = None  # --reasoning-parser: chat replies split into reasoning, content
    tool_parser: ToolParser | None = None  # --tool-call-parser: the format "auto" reads calls in (None: Hermes/Llama-3)
    image_prompts: Any | None = None  # chat image_url parts -> images (LLM.image_prompts, entrypoints/multimodal)
    prompt_embeds: Any | None = None  # /v1/completions' prompt_embeds (LLM.prompt_embeds, entrypoints/prompt_embeds)
    content_format: str = "auto"  # --chat-template-content-format (entrypoints/content_format)
    scheduling_policy: str = "fcfs"  # --scheduling-policy: "priority" lets requests give a priority
    response_role: str = "assistant"  # --response-role: a chat reply's role when it starts a new turn
    tokens_as_ids: bool = False  # --return-tokens-as-token-ids: logprobs name tokens "token_id:N"
    request_log: RequestLog = RequestLog()  # --enable-log-requests / --enable-log-outputs / --max-log-len

    def encode(self, prompt: str | Sequence[int], param: str = "prompt") -> list[int]:
        """Token ids of a text or id prompt; ids must be in the vocabulary."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise APIError("this model has no tokenizer; send token ids", param=param)
            return list(self.tokenizer.encode(prompt, verbose=False))
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise APIError(f"{param}: token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})", param=param)
        return list(prompt)

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter a model name asks for: None for the served model (or no name); 404 for a
        name this server does not serve."""
        if model is None or model == self.model_name:
            return None
        if model in self.adapters:
            return self.adapters[model]
        served = ", ".join(f"`{name}`" for name in [self.model_name, *self.adapters])
        raise APIError(f"the model `{model}` does not exist; this server serves {served}", 404, "model",
                       kind="NotFoundError")

    def max_tokens(self, requested: int | None, prompt_len: int, default: int | None) -> int:
        """The request's max_tokens, or what is left of the context when it gives none; at most the generation
        config's max_new_tokens either way, as vLLM has it (its get_max_tokens takes the least of them)."""
        value = requested if requested is not None else default
        if value is None:
            value = self.limits.default_max_tokens(self.max_seq_len - prompt_len)
        if value < 1:
            raise APIError(f"max_tokens must be >= 1, got {value}", param="max_tokens")
        return value if self.max_new_tokens is None else min(value, self.max_new_tokens)

    def check_stop_ids(self, stop_token_ids: list[int] | None) -> None:
        """400 for stop token ids outside the vocabulary."""
        try:
            validation.token_ids(stop_token_ids or [], "stop_token_ids", self.vocab_size)
        except ValueError as error:
            raise APIError(str(error), param="stop_token_ids") from None

    def check_length(self, ids: list[int], max_tokens: int) -> None:
        """400 for an empty prompt or one that does not fit with max_tokens."""
        try:
            check_prompt(ids, max_tokens, self.vocab_size, self.max_seq_len)
        except ValueError as error:
            raise APIError(str(error), param="prompt") from None

    def priority(self, requested: int) -> int:
        """The request's priority field; 400 for one other than 0 unless --scheduling-policy is priority."""
        try:
            return check_priority(requested, self.scheduling_policy)
        except (TypeError, ValueError) as error:
            raise APIError(str(error).replace("LLM(..., scheduling_policy='priority') or ", ""),
                           param="priority") from None

    def timeout(self, requested: float | None) -> float | None:
        """Seconds a request may take: its `timeout` field or --request-timeout, the smaller where both are set."""
        if requested is not None and not requested > 0:
            raise APIError(f"timeout must be a number of seconds > 0, got {requested}", param="timeout")
        given = [t for t in (requested, self.request_timeout) if t is not None]
        return min(given) if given else None

    def start(self, request: Request, samples: int) -> None:
        """Admit a generation request's sequences (503 with Retry-After when the queue is full)."""
        self.admission.admit(request.scope, samples)


def deadline_after(timeout: float | None) -> float | None:
    """The event loop's time `timeout` seconds from now (what AsyncLLMEngine.generate takes)."""
    return None if timeout is None else asyncio.get_running_loop().time() + timeout


def engine_error(error: BaseException, timeout: float | None = None) -> APIError:
    """The error a request's client gets when its generation raised instead of finishing."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, RequestTimeout):
        return APIError(f"the request did not finish within its timeout ({timeout:g} s, the `timeout` field or "
                        "--request-timeout) and was aborted", 504, param="timeout", kind="timeout_error")
    if isinstance(error, EngineAsleep):
        return APIError("the server is asleep (POST /sleep): POST /wake_up first" if error.level == 1 else
                        "the server's weights were discarded (POST /sleep?level=2): POST /wake_up and "
                        "/update_weights_from_disk first", 503, kind="service_unavailable")
    if isinstance(error, ServerStopping):
        return APIError("the server is shutting down and aborted this request after --shutdown-timeout", 503,
                        kind="service_unavailable")
    return APIError(f"generation failed: {type(error).__name__}: {error}", 500)


def error_event(error: BaseException, timeout: float | None) -> dict:
    """The body of the error event a stream ends with when its generation raised."""
    api = engine_error(error, timeout)
    return error_body(api.message, api.kind, api.param, api.status)


class EventStream(StreamingResponse):
    """Server-sent events that close their generator however the response ends.

    Starlette leaves the generator of a response cut short (a disconnect, a stalled client) to the
    garbage collector, which may take a while to find it in a reference cycle; its cleanup aborts
    the request, so it must run now, or the request keeps its slot and pages meanwhile.
    """

    def __init__(self, events: AsyncIterator[str]):
        super().__init__(events, media_type="text/event-stream")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


def new_id(prefix: str) -> str:
    """A response id like OpenAI's (`cmpl-...`, `chatcmpl-...`)."""
    return f"{prefix}-{uuid.uuid4().hex}"


async def merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, delta) from several streams as they arrive; a stream's error is raised here, and
    closing it (or that error) aborts the unfinished ones.

    The queue holds one item per stream at most: a reader that falls behind (a client reading
    slowly) leaves the deltas merging in the engine's collectors instead of piling up here.
    """
    queue: asyncio.Queue[tuple[int, RequestOutput | Exception | None]] = asyncio.Queue(maxsize=len(streams))

    async def pump(i: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for delta in stream:
                await queue.put((i, delta))
        except Exception as error:  # handed to the reader: a pump that died silently would hang it
            await queue.put((i, error))
            return
        await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()  # a cancelled pump closes its stream, which aborts the request


async def collect(streams: list[AsyncIterator[RequestOutput]], request: Request,
                  timeout: float | None = None) -> list[RequestOutput]:
    """Final outputs of every stream; a client that disconnects first aborts them all, and a stream's
    error (a timeout, a shutdown, an engine failure) is the response's (`timeout` names the former)."""
    totals: list[RequestOutput | None] = [None] * len(streams)

    async def gather() -> None:
        async for i, delta in merge(streams):
            totals[i] = accumulate(totals[i], delta)

    work = asyncio.create_task(gather())
    watch = asyncio.create_task(_disconnected(request))
    done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    watch.cancel()
    if work not in done:
        work.cancel()
        raise APIError("client disconnected", 499)
    if work.exception() is not None:
        raise engine_error(work.exception(), timeout)
    return totals  # type: ignore[return-value]


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body was read already, so only disconnects arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def finish_error(output: RequestOutput) -> None:
    """A request the engine failed is a 500 for a non-streaming client."""
    if any(o.finish_reason == "error" for o in output.outputs):
        raise APIError(f"generation failed: {output.error}", 500)
