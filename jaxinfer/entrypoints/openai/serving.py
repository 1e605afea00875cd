"""What the endpoints share: the server state, prompt checks, and running requests on the async engine."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from typing import Any, AsyncIterator, Sequence

from fastapi import Request

from jaxinfer.config import validation
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine import AsyncLLMEngine, RequestOutput
from jaxinfer.engine.outputs import accumulate
from jaxinfer.engine.prompt_checks import check_prompt
from jaxinfer.entrypoints.openai.errors import APIError


@dataclasses.dataclass
class ServerState:
    """One model behind one async engine, and the facts the endpoints check requests against."""

    engine: AsyncLLMEngine
    tokenizer: Any | None
    model_name: str
    max_seq_len: int
    vocab_size: int
    default_params: SamplingParams
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

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

    def check_model(self, model: str | None) -> None:
        """404 for a model name this server does not serve (None means the served one)."""
        if model is not None and model != self.model_name:
            raise APIError(f"the model `{model}` does not exist; this server serves `{self.model_name}`", 404, "model",
                           kind="NotFoundError")

    def max_tokens(self, requested: int | None, prompt_len: int, default: int | None) -> int:
        """The request's max_tokens, or what is left of the context when it gives none."""
        value = requested if requested is not None else default
        if value is None:
            value = self.max_seq_len - prompt_len
        if value < 1:
            raise APIError(f"max_tokens must be >= 1, got {value}", param="max_tokens")
        return value

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


def new_id(prefix: str) -> str:
    """A response id like OpenAI's (`cmpl-...`, `chatcmpl-...`)."""
    return f"{prefix}-{uuid.uuid4().hex}"


async def merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, delta) from several streams as they arrive; closing it aborts the unfinished ones."""
    queue: asyncio.Queue[tuple[int, RequestOutput | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for delta in stream:
                queue.put_nowait((i, delta))
        finally:  # a stream that raised ends too: its error surfaces below instead of a wait forever
            queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, delta = await queue.get()
            if delta is None:
                remaining -= 1
            else:
                yield i, delta
        for task in tasks:
            task.result()  # an engine failure surfaces here
    finally:
        for task in tasks:
            task.cancel()  # a cancelled pump closes its stream, which aborts the request


async def collect(streams: list[AsyncIterator[RequestOutput]], request: Request) -> list[RequestOutput]:
    """Final outputs of every stream; a client that disconnects first aborts them all."""
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
    work.result()
    return totals  # type: ignore[return-value]


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body was read already, so only disconnects arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def finish_error(output: RequestOutput) -> None:
    """A request the engine failed is a 500 for a non-streaming client."""
    if any(o.finish_reason == "error" for o in output.outputs):
        raise APIError(f"generation failed: {output.error}", 500)
