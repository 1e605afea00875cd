"""POST /v1/responses (OpenAI's Responses API) on the chat path, and GET/DELETE /v1/responses/{id}.

A request becomes a chat request (responses_protocol.py) and runs as one: chat.prepare_chat_images
renders and checks it (its input_image parts read as chat's image_url parts), the engine generates,
chat_messages turns the text into the assistant's reasoning, content and tool calls (whole, or
ChoiceStream's deltas), and those become the Response's output items (responses_output.py) or its
stream of events (responses_stream.py). With `store` (the default) the
finished Response and its conversation are kept (responses_store.py) for `previous_response_id`, whose
turns come before the new input, and for GET.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from jaxinfer.engine import RequestOutput
from jaxinfer.entrypoints.openai.beam_search import generation
from jaxinfer.entrypoints.openai.chat import prepare_chat_images
from jaxinfer.entrypoints.openai.chat_messages import ChoiceStream, ReplyPlan, assistant_message
from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.formatting import sse
from jaxinfer.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from jaxinfer.entrypoints.openai.responses_output import conversation, finished, item_id, output_items, response_object
from jaxinfer.entrypoints.openai.responses_output import usage as response_usage
from jaxinfer.entrypoints.openai.responses_protocol import (
    ResponsesRequest,
    chat_request,
    check_supported,
    input_messages,
    responses_error,
)
from jaxinfer.entrypoints.openai.responses_store import ResponseStore, StoredResponse
from jaxinfer.entrypoints.openai.responses_stream import ResponseEvents
from jaxinfer.entrypoints.openai.serving import (
    EventStream,
    ServerState,
    collect,
    deadline_after,
    error_event,
    finish_error,
    merge,
)


def add_responses_routes(app: FastAPI, state: ServerState, store: ResponseStore, check: Any) -> None:
    """The Responses API's routes; `check(route)` refuses them on a server that does not generate."""

    @app.post("/v1/responses")
    async def create(body: ResponsesRequest, request: Request):
        check("/v1/responses")
        return await create_response(body, state, store, request)

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, stream: bool = False) -> JSONResponse:
        if stream:
            raise APIError("stream is not supported on GET /v1/responses/{id} (a stored response is finished); "
                           "leave it out", param="stream")
        return JSONResponse(store.get(response_id).response)

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> JSONResponse:
        store.delete(response_id)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


async def create_response(body: ResponsesRequest, state: ServerState, store: ResponseStore,
                          request: Request) -> Response:
    """Run one Response: stream its events, or return it whole."""
    adapter = state.check_model(body.model)
    priority = state.priority(body.priority)
    check_supported(body)
    timeout = state.timeout(None)
    deadline = deadline_after(timeout)
    turn = [*_history(store, body.previous_response_id), *input_messages(body.input)]
    chat = chat_request(body, turn)
    ids, images, params, plan = await asyncio.to_thread(_prepare, state, chat)  # reading images: off the loop
    state.start(request, 1)
    ident = item_id("resp")
    outputs = generation(state, ids, params, ident, deadline, body.stream, adapter, images, priority)
    response = response_object(body, ident, adapter.lora_name if adapter else state.model_name, params)
    if body.stream:
        return EventStream(_stream(state, store if body.store else None, response, turn, merge([outputs]), len(ids),
                                   timeout, plan))
    (output,) = await collect([outputs], request, timeout)
    finish_error(output)
    out = output.outputs[0]
    message, _ = assistant_message(plan, out.text, out.finish_reason)
    items = output_items(message, out.finish_reason)
    counts = response_usage(len(ids), len(out.token_ids), _reasoning_tokens(state, items))
    response = finished(response, items, out.finish_reason, counts)
    if body.store:
        store.save(StoredResponse(response, conversation(turn, items)))
    return JSONResponse(response)


def _history(store: ResponseStore, previous_response_id: str | None) -> list[ChatMessage]:
    """The conversation previous_response_id continues (a 404 naming it when none is stored)."""
    if previous_response_id is None:
        return []
    return store.get(previous_response_id, "previous_response_id").conversation


def _prepare(state: ServerState, chat: ChatCompletionRequest) -> tuple[list[int], tuple, Any, ReplyPlan]:
    """chat's prepare (ids, images, params, plan), its 400s naming the Responses fields."""
    try:
        return prepare_chat_images(state, chat)
    except APIError as error:
        raise responses_error(error) from None


def _reasoning_tokens(state: ServerState, items: list[dict]) -> int:
    """Tokens of the reasoning items' text."""
    text = "".join(part["text"] for item in items if item["type"] == "reasoning" for part in item["content"])
    return len(state.tokenizer.encode(text, add_special_tokens=False)) if text else 0


def _sse(event: dict) -> str:
    """One event as OpenAI sends it: named by its type, then its JSON."""
    return f"event: {event['type']}\n{sse(event)}"


async def _stream(state: ServerState, store: ResponseStore | None, response: dict, turn: list[ChatMessage],
                  deltas: AsyncIterator[tuple[int, RequestOutput]], input_tokens: int, timeout: float | None,
                  plan: ReplyPlan) -> AsyncIterator[str]:
    """The Response's events as text deltas arrive; a generation that raises ends with an `error` event."""
    events, reply, generated = ResponseEvents(response), ChoiceStream(plan), 0
    for event in events.start():
        yield _sse(event)
    try:
        async for _, delta in deltas:
            if delta.error:
                raise RuntimeError(delta.error)
            out = delta.outputs[0]
            generated += len(out.token_ids)
            message, _ = reply.delta(out.text, out.finish_reason)
            for event in events.delta(message or {}):
                yield _sse(event)
            if out.finish_reason:
                for event in events.close(out.finish_reason):
                    yield _sse(event)
                counts = response_usage(input_tokens, generated, _reasoning_tokens(state, events.output))
                terminal, final = events.complete(out.finish_reason, counts)
                if store is not None:
                    store.save(StoredResponse(final, conversation(turn, final["output"])))
                yield _sse(terminal)
    except Exception as error:  # the status line went out already: the error is the stream's last event
        body = error_event(error, timeout)["error"]
        yield _sse(events.event("error", code=body["code"], message=body["message"], param=body["param"]))
    finally:
        await deltas.aclose()  # a client gone mid-stream: abort the request and free its pages
