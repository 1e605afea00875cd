"""`jaxinfer serve`: its flags; the port bound, then the model loaded and warmed while uvicorn answers 503."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import os
import threading
import time
from typing import TYPE_CHECKING

from jaxinfer.config import validation
from jaxinfer.entrypoints.cli_args import add_memory_args, add_parallel_args, add_quantization_args
from jaxinfer.entrypoints.openai.lora_modules import (
    add_lora_args,
    check_served_name,
    lora_modules,
    register,
    runtime_lora_updating,
)
from jaxinfer.entrypoints.openai.reasoning import PARSERS
from jaxinfer.entrypoints.openai.tool_parsers import TOOL_PARSERS
from jaxinfer.entrypoints.openai.weight_flags import add_weight_args, check_weight_flags

if TYPE_CHECKING:  # imported when serving: StartingApp needs the serve extra, which `jaxinfer --help` must not
    from jaxinfer import LLM
    from jaxinfer.entrypoints.openai.app import ServerConfig
    from jaxinfer.entrypoints.openai.shadow import ShadowRouter
    from jaxinfer.entrypoints.openai.shadow_stats import ShadowSettings
    from jaxinfer.entrypoints.openai.startup import StartingApp

DEFAULT_PORT = 8000
DEFAULT_SHUTDOWN_TIMEOUT = 25.0  # below Kubernetes' 30 s grace period, leaving time to abort and exit


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    """The `serve` subcommand and its flags (engine knobs default to LLM's)."""
    serve = sub.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over HTTP: /v1/completions, /v1/chat/completions (or with --runner pooling "
        "/v1/embeddings, /classify, /v1/score, /rerank), /v1/models, "
        "/tokenize, /detokenize, /health (503 while the model loads and compiles) and Prometheus /metrics. "
        "Needs the serve extra: pip install 'jaxinfer[serve]'.",
    )
    serve.add_argument("--model", default=None, help="HF or converted model directory (default: the demo model)")
    serve.add_argument("--served-model-name", default=None, help="the name clients pass as `model` (default: the directory name)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 exposes the server to the network (default: %(default)s)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT,
                       help="TCP port, bound before the model loads; 0 picks a free one (default: %(default)s)")
    serve.add_argument("--api-key", default=os.environ.get("JAXINFER_API_KEY"),
                       help="require `Authorization: Bearer KEY` on every route but /health (default: "
                       "$JAXINFER_API_KEY, which unlike the flag other users cannot read in the process list; else none)")
    serve.add_argument("--metrics-without-key", action="store_true",
                       help="with --api-key: serve /metrics without the key (for a Prometheus scraper)")
    serve.add_argument("--max-model-len", type=int, default=None, help="longest prompt + completion in tokens (default: the model's, <= 2048)")
    serve.add_argument("--dtype", default="auto", help="auto (the checkpoint's), float32, bfloat16 or float16 (default: %(default)s)")
    serve.add_argument("--max-num-seqs", type=int, default=64, help="sequences decoded together per step (default: %(default)s)")
    serve.add_argument("--max-num-batched-tokens", type=int, default=512, help="tokens per step; longer prompts are prefilled in chunks (default: %(default)s)")
    serve.add_argument("--num-pages", type=int, default=None, help="KV-cache pages in the pool (default: what --gpu-memory-utilization leaves on a GPU or TPU; on CPU room for half of max-num-seqs at full length)")
    serve.add_argument("--page-size", type=int, default=16, help="tokens per KV-cache page, a power of two (default: %(default)s)")
    serve.add_argument("--decode-steps", type=int, default=8, help="decode steps per device call when nothing waits (default: %(default)s)")
    serve.add_argument("--stream-interval", type=int, default=None,
                       help="decode steps per device call at most while a stream is in the batch (default: as "
                            "many as take 50 ms at the measured step time, so streamed tokens arrive at least that "
                            "often; 1: every token as it is made, at the cost of a host round trip per token)")
    add_parallel_args(serve)
    add_quantization_args(serve)
    add_memory_args(serve)
    serve.add_argument("--no-prefix-caching", action="store_true", help="do not reuse the KV pages of shared prompt prefixes")
    serve.add_argument("--batch-invariant", action="store_true",
                       help="a request's tokens and logprobs bitwise the same whatever else is batched with it "
                       "(CPU only so far; slower: see docs/engine.md)")
    serve.add_argument("--speculative-method", choices=["ngram", "ngram_device", "suffix", "draft", "eagle"],
                       default=None,
                       help="speculate inside the engine: ngram proposes what followed the last n tokens "
                       "earlier in the prompt and output (no second model; ngram_device looks it up on the device, "
                       "several verify rounds a call), suffix the most frequent continuation in the "
                       "prompt, output and recent requests' outputs (suffix decoding), draft runs --speculative-model, "
                       "eagle the EAGLE head in --speculative-model over the target's hidden states; "
                       "outputs keep the target's distribution (greedy: identical)")
    serve.add_argument("--speculative-model", default=None,
                       help="for --speculative-method draft: a draft model directory (same tokenizer as --model); "
                       "for eagle: an EAGLE-1 or EAGLE-3 head directory")
    serve.add_argument("--num-speculative-tokens", type=int, default=4,
                       help="drafts per sequence and step at most, 1-32, with --speculative-method (default: %(default)s)")
    add_bounds_args(serve)
    add_shadow_args(serve)
    add_lora_args(serve)
    add_weight_args(serve)
    serve.add_argument("--reasoning-parser", choices=list(PARSERS), default=None,
                       help="as vLLM's flag: chat replies carry the model's `<think> ... </think>` as "
                       "reasoning_content (and vLLM's newer `reasoning`), the rest as content; deepseek_r1 "
                       "(DeepSeek-R1, its distills, QwQ: text before </think> is reasoning, <think> or not), qwen3 "
                       "(reasoning only when <think> opens the reply), openai_gptoss (GPT-OSS's harmony format: the "
                       "analysis channel is reasoning, the final channel content) (default: none, the reply is content)")
    serve.add_argument("--tool-call-parser", choices=list(TOOL_PARSERS), default=None,
                       help="as vLLM's flag: the format tool calls are read in from a chat reply with tool_choice "
                       "auto, by model family (docs/serving.md); openai (GPT-OSS's harmony calls) goes with "
                       "--reasoning-parser openai_gptoss (default: Hermes <tool_call> blocks, else Llama-3 JSON)")
    serve.add_argument("--runner", choices=["auto", "generate", "pooling"], default="auto",
                       help="as vLLM's: pooling serves embeddings (POST /v1/embeddings: the final hidden states "
                       "pooled, e.g. Qwen3-Embedding, e5-mistral) and scores (/v1/score, /rerank; /classify for a "
                       "*ForSequenceClassification model), generate completions and chat; auto pools for a model "
                       "saved without an output head (Qwen3Model, Qwen2ForSequenceClassification, ...) "
                       "(default: %(default)s)")
    serve.add_argument("--pooler-config", default=None, metavar="JSON",
                       help='with --runner pooling, as vLLM\'s: {"pooling_type": "LAST"|"MEAN"|"CLS", "normalize": '
                       "true|false}; fields left out take the model's sentence-transformers settings, else LAST "
                       "and normalized")
    serve.add_argument("--limit-mm-per-prompt", default=None, metavar="JSON",
                       help='as vLLM\'s: {"image": N}, the most images one chat request may carry (default 999)')
    serve.add_argument("--allowed-local-media-path", default=None, metavar="DIR",
                       help="as vLLM's: the directory file:// image URLs may read from (default: none; data: and "
                       "http(s) URLs are always read)")
    serve.add_argument("--enable-prompt-embeds", action="store_true",
                       help="as vLLM's: /v1/completions takes prompt_embeds, base64 of torch.save'd [L, hidden] "
                       "tensors (default: off)")
    serve.add_argument("--skip-warmup", action="store_true", help="start at once and compile on first use instead of ahead of time")
    serve.add_argument("--load-session", action="append", default=[], metavar="DIR",
                       help="restore a session saved by LLM.save_session into the prefix cache before serving: "
                       "requests whose prompts start with its prompt skip its prefill (repeatable)")
    serve.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                       help="uvicorn's log level; info logs every request (default: %(default)s)")
    serve.set_defaults(run=run_serve)


def add_bounds_args(serve: argparse.ArgumentParser) -> None:
    """Flags bounding requests, queues and times (see entrypoints/openai/limits.py, gate.py, shutdown.py)."""
    from jaxinfer.config.sampling_params import MAX_LOGPROBS, MAX_N

    add = serve.add_argument
    add("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413 (default: %(default)s)")
    add("--max-n", type=int, default=MAX_N, help=f"most samples per prompt (`n`), 1-{MAX_N} (default: %(default)s)")
    add("--max-tokens-limit", type=int, default=None,
        help="most tokens a request may generate (`max_tokens`); requests that give none get at most this "
        "(default: what the context leaves)")
    add("--max-logprobs", type=int, default=MAX_LOGPROBS,
        help=f"most log-probabilities per token (`logprobs`, `top_logprobs`), 0-{MAX_LOGPROBS} (default: %(default)s)")
    add("--max-stop-sequences", type=int, default=16,
        help="most entries in `stop` and in `stop_token_ids`, each (default: %(default)s)")
    add("--max-prompts", type=int, default=256, help="most prompts in one /v1/completions call (default: %(default)s)")
    add("--max-stored-responses", type=int, default=1024,
        help="/v1/responses kept in memory for previous_response_id and GET /v1/responses/{id}; past them the "
        "least recently used are dropped; 0 keeps none (default: %(default)s)")
    add("--max-waiting-requests", type=int, default=1024,
        help="sequences that may wait for a slot (a request of n samples is n); a request that would wait "
        "past them behind others gets 503 with Retry-After (default: %(default)s)")
    add("--request-timeout", type=float, default=None,
        help="seconds a request may take from arrival; past them it is aborted (its pages freed) with a 504; "
        "a request's `timeout` field may ask for less (default: none)")
    add("--write-timeout", type=float, default=60.0,
        help="seconds a response may wait for a client that reads nothing; then it is dropped and its "
        "request aborted (default: %(default)s)")
    add("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT,
        help="on SIGTERM or SIGINT: seconds the requests in flight may take to finish (new ones get 503) "
        "before the rest are aborted with an error; a second signal aborts at once (default: %(default)s)")


def add_shadow_args(serve: argparse.ArgumentParser) -> None:
    """Shadow validation and automatic fallback (docs/validation.md)."""
    serve.add_argument("--shadow-fraction", type=float, default=0.0,
                       help="fraction of requests also run, after they finish and off their latency path, on a "
                       "reference configuration and scored against it (/metrics, GET /debug/shadow); 0 turns it "
                       "off (default: %(default)s)")
    serve.add_argument("--shadow-config", default="",
                       help="the reference as LLM key=value pairs over the served settings, which it takes without "
                       "speculation, quantization, KV quantization or prefix caching (e.g. dtype=bfloat16; "
                       "default: those alone)")
    serve.add_argument("--shadow-min-agreement", type=float, default=0.9,
                       help="a lossy optimization (quantization, kv-cache-dtype, another model or dtype) falls back "
                       "to the reference when the mean shadow agreement drops below this (default: %(default)s)")
    serve.add_argument("--shadow-window", type=int, default=16,
                       help="... over this many recent shadowed requests (default: %(default)s)")
    serve.add_argument("--no-fallback", action="store_true",
                       help="measure only: never switch requests to the reference path")


def shadow_settings(args: argparse.Namespace) -> ShadowSettings:
    """The --shadow-* flags as settings (fraction 0: no shadowing); a bad value is a ValueError naming its flag."""
    from jaxinfer.entrypoints.openai.shadow_stats import ShadowSettings

    settings = ShadowSettings(args.shadow_fraction, {}, args.shadow_min_agreement, args.shadow_window,
                              not args.no_fallback)
    if settings.fraction == 0:
        if args.shadow_config:
            raise ValueError("--shadow-config names the reference of shadow validation: give --shadow-fraction > 0 too")
        return settings
    from jaxinfer.entrypoints.compare.configs import parse_pairs  # loads jax: only when shadowing

    return dataclasses.replace(settings, reference=parse_pairs(args.shadow_config, "--shadow-config"))


def pooler_config(text: str | None) -> dict | None:
    """--pooler-config's JSON object (its fields are checked by LLM's PoolerConfig)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--pooler-config must be a JSON object, got {text!r} ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"--pooler-config must be a JSON object such as '{{\"pooling_type\": \"MEAN\"}}', "
                         f"got {text!r}")
    return value


def limit_mm_per_prompt(text: str | None) -> dict | None:
    """--limit-mm-per-prompt's JSON object (its values are checked by LLM)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--limit-mm-per-prompt must be a JSON object, got {text!r} ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"--limit-mm-per-prompt must be a JSON object such as '{{\"image\": 2}}', got {text!r}")
    return value


def _check(args: argparse.Namespace) -> None:
    validation.integer(args.port, "--port", 0, 65535)
    validation.integer(args.max_body_bytes, "--max-body-bytes", 1)
    validation.integer(args.max_waiting_requests, "--max-waiting-requests", 0)
    validation.integer(args.max_stored_responses, "--max-stored-responses", 0)
    for flag in ("--request-timeout", "--write-timeout", "--shutdown-timeout"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and not value > 0:
            raise ValueError(f"{flag} must be a number of seconds > 0, got {value}")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key is empty; give a key or leave the flag out")
    if (args.speculative_method in ("draft", "eagle")) != (args.speculative_model is not None):
        raise ValueError("--speculative-model DIR goes with --speculative-method draft or eagle, and only with them")
    if args.speculative_model is not None:
        validation.model_dir(args.speculative_model, "--speculative-model")
    if args.model is not None:  # before the port is bound: a wrong path is one error line, nothing else
        validation.model_dir(args.model, "--model")
    if args.load_session:
        from jaxinfer.checkpoint.kv_session import read_meta

        for path in args.load_session:
            try:
                read_meta(path)  # a session directory this version reads
            except ValueError as error:
                raise ValueError(f"--load-session {path}: {error}") from None
    if args.load_session and args.no_prefix_caching:
        raise ValueError("--load-session restores into the prefix cache, which --no-prefix-caching turns off")
    shadow_settings(args)  # every --shadow-* value, before the port is bound
    pooler_config(args.pooler_config)
    limit_mm_per_prompt(args.limit_mm_per_prompt)
    check_served_name(lora_modules(args), args.served_model_name)  # a directory's name: checked again once loaded
    runtime_lora_updating(args)
    check_weight_flags(args)


def _server_config(args: argparse.Namespace, model_name: str) -> ServerConfig:
    """The server's bounds from the flags (Limits checks its own, naming the flag)."""
    from jaxinfer.entrypoints.openai.app import ServerConfig
    from jaxinfer.entrypoints.openai.limits import Limits

    limits = Limits(max_n=args.max_n, max_tokens=args.max_tokens_limit, max_logprobs=args.max_logprobs,
                    max_stop=args.max_stop_sequences, max_prompts=args.max_prompts)
    return ServerConfig(
        model_name, args.api_key, args.max_body_bytes, args.metrics_without_key, limits, args.max_waiting_requests,
        args.request_timeout, args.write_timeout, lora_modules(args), runtime_lora_updating(args),
        args.reasoning_parser, args.tool_call_parser, args.max_stored_responses, args.enable_sleep_mode,
        args.enable_weight_updates,
    )


def exposed_without_key(host: str, api_key: str | None) -> bool:
    """True when the server would answer other machines (not a loopback address) and asks no key."""
    if api_key is not None or host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return True


def run_serve(args: argparse.Namespace) -> int:
    """Bind the port, then load the model and compile its step shapes while /health answers 503,
    and serve until SIGTERM or SIGINT (Ctrl-C), which drain the requests in flight first."""
    _check(args)
    try:
        import uvicorn

        from jaxinfer.entrypoints.openai.app import build_app
        from jaxinfer.entrypoints.openai.shutdown import StopSignals, drain
        from jaxinfer.entrypoints.openai.startup import StartingApp, bind
    except ImportError as error:
        raise ValueError(f"jaxinfer serve needs the serve extra ({error.name} is missing): pip install 'jaxinfer[serve]'") from None
    signals = StopSignals()
    signals.install()  # first: a signal from now on ends the start at once (exit 0)
    server_config = _server_config(args, "")  # the bounds' flags checked before anything is bound or loaded
    sock = bind(args.host, args.port)  # before minutes of loading: a taken port fails now
    starting = StartingApp()
    # lifespan off: the app starts as StartingApp, and the real one registers no lifespan events.
    config = uvicorn.Config(starting, log_level=args.log_level, timeout_graceful_shutdown=5, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), name="uvicorn", daemon=True)
    thread.start()
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    starting.say(f"listening on {url}; GET /health answers 503 until the model is ready")
    if exposed_without_key(args.host, args.api_key):
        starting.say(f"warning: --host {args.host} answers other machines and no --api-key is set: anyone who "
                     "reaches the port can use the model; set --api-key (or $JAXINFER_API_KEY)")
    try:
        llm, kwargs = _load(args, starting)
        name = args.served_model_name or llm.model_dir.name
        check_served_name(server_config.lora_modules, name)
        shadow = _shadow(llm, kwargs, shadow_settings(args), starting)
        app = build_app(llm, dataclasses.replace(server_config, model_name=name), shadow)
        starting.ready(app)
        starting.say(f"ready: serving `{name}` at {url}/v1")
        signals.serving = True  # from now on a signal drains instead of ending the process
        while not signals.received and thread.is_alive():
            time.sleep(0.1)
        if signals.received:
            drain(app.state.traffic, app.state.server.engine, args.shutdown_timeout, signals, starting.say)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    return 0


def _load(args: argparse.Namespace, starting: StartingApp) -> tuple[LLM, dict]:
    """The model, loaded and (unless --skip-warmup) compiled, its progress told to `starting`, and its kwargs."""
    from jaxinfer import LLM, SpeculativeConfig

    speculative = None
    if args.speculative_method is not None:
        speculative = SpeculativeConfig(
            method=args.speculative_method, draft_model=args.speculative_model,
            num_speculative_tokens=args.num_speculative_tokens,
        )
    starting.phase("loading the model")
    kwargs = dict(
        model=args.model, dtype=args.dtype, max_seq_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, num_pages=args.num_pages, page_size=args.page_size,
        decode_steps=args.decode_steps, stream_interval=args.stream_interval, enable_prefix_caching=False if args.no_prefix_caching else None, speculative=speculative,
        tensor_parallel_size=args.tp, data_parallel_size=args.dp, expert_parallel_size=args.ep,
        quantization=args.quantization, quantize_lm_head=args.quantize_lm_head, kv_cache_dtype=args.kv_cache_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization, batch_invariant=args.batch_invariant,
        enable_lora=args.enable_lora, max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
        runner=args.runner, pooler_config=pooler_config(args.pooler_config),
        limit_mm_per_prompt=limit_mm_per_prompt(args.limit_mm_per_prompt),
        allowed_local_media_path=args.allowed_local_media_path, enable_prompt_embeds=args.enable_prompt_embeds,
    )
    llm = LLM(**kwargs)
    register(llm, lora_modules(args))
    if not args.skip_warmup:
        starting.phase("compiling programs", "once per machine with the compile cache")
        if llm.runner_type == "pooling":  # the pooled passes of the model's pooling type (and head), not the steps
            head = None if llm.classifier is None else llm.classifier.weight
            count = llm.engine.runner.warm_up_embeddings(llm.pooler.pooling, starting.compiled, head)
        else:
            count = llm.engine.warmup(on_program=starting.compiled)
        stored = int(llm.engine.runner.warmup_seconds.get("stored", 0))
        starting.say(f"{count} programs ready, {stored} of them loaded untraced from the program store")
    for path in args.load_session:
        info = llm.load_session(path)
        starting.say(f"session {info.path}: the KV of {info.num_cached_tokens} prompt tokens restored")
    return llm, kwargs


def _shadow(llm: LLM, kwargs: dict, settings: ShadowSettings, starting: StartingApp) -> ShadowRouter | None:
    """The router: with shadowing, its reference loaded (on the served weights when it can); without,
    only for speculation's fallback when the server speculates; else None."""
    from jaxinfer.entrypoints.openai.shadow import ShadowRouter

    if settings.fraction > 0 and llm.runner_type == "pooling":
        raise ValueError("--shadow-fraction validates generated tokens, and --runner pooling serves embeddings; "
                         "leave the --shadow-* flags out")
    if settings.fraction == 0:
        return None if kwargs["speculative"] is None else ShadowRouter(llm, kwargs, settings)
    starting.phase("loading the shadow reference")
    router = ShadowRouter(llm, kwargs, settings)
    shared = "the served weights" if router.shares_weights else "a second copy of the model"
    checked = ", ".join(f"{name} ({kind})" for name, kind in router.optimizations.items()) or "nothing"
    starting.say(f"shadowing {settings.fraction:g} of requests on {shared}; validating {checked}")
    return router

