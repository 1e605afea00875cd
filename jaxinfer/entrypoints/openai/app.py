"""The FastAPI app: OpenAI-compatible routes over one AsyncLLMEngine (`build_app(llm)`)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from jaxinfer.config.generation import generation_defaults
from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.pooler import Pooler
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine import AsyncLLMEngine
from jaxinfer.entrypoints.content_format import check_content_format
from jaxinfer.entrypoints.openai.chat import (
    ChatCompletionRequest,
    chat_content_format,
    chat_prompt_ids,
    create_chat_completion,
)
from jaxinfer.entrypoints.openai.completions import CompletionRequest, create_completion
from jaxinfer.entrypoints.openai.cors import Cors, add_cors
from jaxinfer.entrypoints.openai.embeddings import EmbeddingRequest, create_embeddings
from jaxinfer.entrypoints.openai.errors import APIError, RequestGuard, install_handlers
from jaxinfer.entrypoints.openai.gate import Admission, ServingGate, Traffic
from jaxinfer.entrypoints.openai.http_middleware import RequestIdHeader, RootPath
from jaxinfer.entrypoints.openai.limits import Limits
from jaxinfer.entrypoints.openai.lora_routes import add_lora_routes
from jaxinfer.entrypoints.openai.metrics import FallbackCollector, engine_registry, metrics_text
from jaxinfer.entrypoints.openai.profile_routes import add_profile_routes
from jaxinfer.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from jaxinfer.entrypoints.openai.reasoning import reasoning_parser
from jaxinfer.entrypoints.openai.request_log import RequestLog
from jaxinfer.entrypoints.openai.responses import add_responses_routes
from jaxinfer.entrypoints.openai.responses_store import DEFAULT_MAX_STORED_RESPONSES, ResponseStore
from jaxinfer.entrypoints.openai.scoring import add_scoring_routes
from jaxinfer.entrypoints.openai.serving import ServerState
from jaxinfer.entrypoints.openai.shadow import ShadowRouter, speculation_fallback
from jaxinfer.entrypoints.openai.tool_parsers import ToolParser, tool_parser
from jaxinfer.entrypoints.openai.transcriptions import add_audio_routes
from jaxinfer.entrypoints.openai.weight_routes import add_sleep_routes, add_update_routes
from jaxinfer.runtime.profiling import PROFILER_DIR_VAR

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: far above any prompt that fits the context
DEFAULT_MAX_WAITING = 1024  # sequences: a bound, not a target; 503s start past it
DEFAULT_WRITE_TIMEOUT = 60.0  # seconds a response may wait for its client to read


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """What the HTTP layer enforces: the served name, the API key, and the bounds on requests and queues.

    api_key guards every route but /health (and /metrics with metrics_without_key); None: no key.
    max_waiting_requests: sequences that may wait for a slot before new requests get 503 (None: no bound).
    request_timeout: seconds any request may take (a request's `timeout` field may ask for less).
    write_timeout: seconds a response may wait for a client that reads nothing before it is dropped.
    """

    model_name: str
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    metrics_without_key: bool = False
    limits: Limits = Limits()
    max_waiting_requests: int | None = DEFAULT_MAX_WAITING
    request_timeout: float | None = None
    write_timeout: float | None = DEFAULT_WRITE_TIMEOUT
    lora_modules: tuple[LoRARequest, ...] = ()  # adapters served by name (--lora-modules)
    runtime_lora_updating: bool = False  # /v1/load_lora_adapter and /v1/unload_lora_adapter
    reasoning_parser: str | None = None  # a name of reasoning.PARSERS: chat replies split into reasoning and content
    tool_call_parser: str | None = None  # a name of tool_parsers.TOOL_PARSERS: the format "auto" reads calls in
    max_stored_responses: int = DEFAULT_MAX_STORED_RESPONSES  # /v1/responses kept for previous_response_id (LRU)
    sleep_mode: bool = False  # POST /sleep, /wake_up, GET /is_sleeping (vLLM's --enable-sleep-mode)
    weight_updates: bool = False  # POST /update_weights_from_disk (SGLang's route)
    cors: Cors = Cors()  # cross-origin requests from web pages (off: no origins)
    chat_template_content_format: str = "auto"  # chat content as text or typed parts (entrypoints/content_format)
    root_path: str = ""  # a path-prefixing proxy's prefix, served with and without it (vLLM's --root-path)
    request_id_headers: bool = False  # X-Request-Id on every response (vLLM's --enable-request-id-headers)
    default_params: SamplingParams | None = None  # what requests leave out (None: the model's generation_config)
    max_new_tokens: int | None = None  # with default_params: the cap on every request's max_tokens (None: none)
    response_role: str = "assistant"  # a chat reply's role when it starts a new turn (vLLM's --response-role)
    return_tokens_as_token_ids: bool = False  # logprobs name tokens "token_id:N" (vLLM's flag)
    request_log: RequestLog = RequestLog()  # requests and outputs logged (vLLM's --enable-log-requests, ...)


def _tool_parser(config: ServerConfig) -> ToolParser | None:
    """The --tool-call-parser; `openai` (harmony calls) goes with --reasoning-parser openai_gptoss and only it."""
    if config.tool_call_parser is None:
        return None
    parser = tool_parser(config.tool_call_parser)
    if (parser.name == "openai") != (config.reasoning_parser == "openai_gptoss"):
        raise ValueError(f"--tool-call-parser {parser.name} does not go with --reasoning-parser "
                         f"{config.reasoning_parser}: GPT-OSS's harmony calls need both openai_gptoss and openai")
    return parser


def _max_new_tokens(llm: Any, config: ServerConfig) -> int | None:
    """The generation config's max_new_tokens, which caps every request's max_tokens as vLLM's does: the
    config's with its default_params, else the model's generation_config.json's."""
    if config.default_params is not None:
        return config.max_new_tokens
    return generation_defaults(llm.model_dir).sampling.get("max_tokens")


def build_app(llm: Any, config: ServerConfig, shadow: ShadowRouter | None = None) -> FastAPI:
    """An app serving `llm` (a jaxinfer.LLM): its engine, tokenizer and default sampling settings;
    with `shadow`, requests go through it (fallback, and shadow validation shown at /debug/shadow).

    `app.state.traffic` is what the ServingGate counts (requests in flight; set `draining` to refuse new
    ones); `app.state.server` the ServerState, whose `engine` is the AsyncLLMEngine (or the router).
    """
    engine = llm.engine
    front = shadow or AsyncLLMEngine(engine)  # the router holds the engine's AsyncLLMEngine itself
    traffic = Traffic()
    admission = Admission(engine.config.max_num_seqs, config.max_waiting_requests, lambda: front.waiting, traffic)
    state = ServerState(
        front, llm.tokenizer, config.model_name, engine.config.max_seq_len,
        engine.model_config.vocab_size, config.default_params or llm.default_params, admission, config.limits,
        config.request_timeout, _max_new_tokens(llm, config),
        adapters={adapter.lora_name: adapter for adapter in config.lora_modules},
        reasoning_parser=None if config.reasoning_parser is None else reasoning_parser(config.reasoning_parser),
        tool_parser=_tool_parser(config), image_prompts=getattr(llm, "image_prompts", None),
        prompt_embeds=getattr(llm, "prompt_embeds", None),
        content_format=check_content_format(config.chat_template_content_format),
        scheduling_policy=engine.config.scheduling_policy, response_role=config.response_role,
        tokens_as_ids=config.return_tokens_as_token_ids, request_log=config.request_log,
    )
    app = FastAPI(title="jaxinfer", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    app.state.traffic = traffic
    install_handlers(app)
    probes = {"/health", "/ping", "/version"}  # a load balancer's probes (SageMaker's /ping) need no key
    public = frozenset(probes | {"/metrics"} if config.metrics_without_key else probes)
    app.add_middleware(RequestGuard, max_body_bytes=config.max_body_bytes, api_key=config.api_key, public_paths=public)
    add_cors(app, config.cors)
    # Outside the guards (added after them): it counts and drains every request, refused ones included.
    app.add_middleware(ServingGate, traffic=traffic, admission=admission, write_timeout=config.write_timeout)
    if config.request_id_headers:
        app.add_middleware(RequestIdHeader)
    if config.root_path:  # outermost: every path check below sees the path without the prefix
        app.add_middleware(RootPath, root_path=config.root_path)
    registry = engine_registry(engine.metrics, _fallback_collector(llm, shadow))
    served = shadow.primary if shadow is not None else front  # adapters and embeddings are never shadowed
    pooler = llm.pooler if getattr(llm, "runner_type", "") == "pooling" else None
    _add_generation_routes(app, state, served, pooler)
    add_responses_routes(app, state, ResponseStore(config.max_stored_responses),
                         lambda route: _check_generating(pooler, state, route))
    add_scoring_routes(app, state, served, llm)  # /classify, /v1/score, /rerank: pooling models only
    add_audio_routes(app, state, llm)  # /v1/audio/transcriptions, /translations: speech models only (Whisper)
    _add_utility_routes(app, state)
    if config.runtime_lora_updating:
        add_lora_routes(app, state, served)
    if config.sleep_mode:
        add_sleep_routes(app, served, llm)
    if config.weight_updates:
        add_update_routes(app, served, llm)
    if os.environ.get(PROFILER_DIR_VAR):
        add_profile_routes(app, served)
    if shadow is not None and shadow.settings.fraction > 0:
        @app.get("/debug/shadow")
        async def debug_shadow() -> JSONResponse:
            return JSONResponse(shadow.debug())

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(metrics_text(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _fallback_collector(llm: Any, shadow: ShadowRouter | None) -> FallbackCollector | None:
    """The fallback gauges (and shadow metrics): the router's, or speculation's own switch alone."""
    if shadow is not None:
        return FallbackCollector(shadow.fallback_states, shadow.stats.snapshot if shadow.settings.fraction > 0 else None)
    if llm.engine.speculator is None and llm.speculation_failure is None:
        return None
    return FallbackCollector(lambda: {"speculation": speculation_fallback(llm)})


def _add_generation_routes(app: FastAPI, state: ServerState, served: AsyncLLMEngine, pooler: Pooler | None) -> None:
    """The model's routes: embeddings for a pooling model (pooler), completions and chat for the others;
    each route of the other kind is a 400 saying how to start a server that serves it."""

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> JSONResponse:
        return JSONResponse(await create_embeddings(body, state, served, pooler))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check_generating(pooler, state, "/v1/completions")
        return await create_completion(body, state, request)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        _check_generating(pooler, state, "/v1/chat/completions")
        return await create_chat_completion(body, state, request)


def _check_generating(pooler: Pooler | None, state: ServerState, route: str) -> None:
    if pooler is not None:
        raise APIError(f"{route} is served by generation models, and `{state.model_name}` was started for "
                       "embeddings (--runner pooling): POST /v1/embeddings, or start the model with --runner "
                       "generate", param="model")


def _add_utility_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:  # SageMaker's health check, as vLLM answers it
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> JSONResponse:
        from jaxinfer import __version__

        return JSONResponse({"version": __version__})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": _model_cards(state)})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> JSONResponse:  # OpenAI's retrieve: `client.models.retrieve(name)`
        card = next((c for c in _model_cards(state) if c["id"] == model_id), None)
        if card is None:
            raise APIError(f"The model `{model_id}` does not exist.", status=404, param="model", kind="NotFoundError")
        return JSONResponse(card)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> JSONResponse:
        state.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError("give exactly one of prompt or messages", param="prompt")
        if state.tokenizer is None:
            raise APIError("this model has no tokenizer")
        if body.messages is not None:  # tokenizing is off the event loop
            ids = await asyncio.to_thread(chat_prompt_ids, state, body.messages,
                                          content_format=chat_content_format(state))
        else:
            ids = list(await asyncio.to_thread(state.tokenizer.encode, body.prompt,
                                               add_special_tokens=body.add_special_tokens))
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": state.max_seq_len})

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> JSONResponse:
        state.check_model(body.model)
        if state.tokenizer is None:
            raise APIError("this model has no tokenizer")
        state.encode(body.tokens, "tokens")  # checks the ids are in the vocabulary
        text = await asyncio.to_thread(state.tokenizer.decode, body.tokens, skip_special_tokens=True,
                                       clean_up_tokenization_spaces=False)
        return JSONResponse({"prompt": text})


def _model_cards(state: ServerState) -> list[dict]:
    """The served model's card, then each LoRA adapter's (its `parent` the model), as /v1/models lists them."""
    card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "jaxinfer",
            "max_model_len": state.max_seq_len}
    adapters = [{**card, "id": name, "root": adapter.lora_path, "parent": state.model_name}
                for name, adapter in state.adapters.items()]
    return [card, *adapters]
