"""`jaxinfer serve`: the port bound, then the model loaded and warmed while uvicorn answers 503 (flags: serve_flags)."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import threading
import time
from typing import TYPE_CHECKING

from jaxinfer.config import validation
from jaxinfer.entrypoints.cli_args import add_memory_args, add_parallel_args, add_quantization_args
from jaxinfer.entrypoints.openai.generation_flags import add_generation_flags, check_generation_flags, served_defaults
from jaxinfer.entrypoints.openai.http_flags import add_http_flags, root_path, uvicorn_options
from jaxinfer.entrypoints.openai.lora_modules import (
    add_lora_args,
    check_served_name,
    lora_modules,
    register,
    runtime_lora_updating,
)
from jaxinfer.entrypoints.openai.request_log import print_request_log
from jaxinfer.entrypoints.openai.serve_flags import (
    add_bounds_args,
    add_chat_args,
    add_engine_args,
    add_input_args,
    add_server_args,
    add_shadow_args,
    add_speculative_args,
    add_startup_args,
)
from jaxinfer.entrypoints.openai.vllm_flags import (
    add_vllm_flags,
    cors_settings,
    prefix_caching,
    request_log,
    response_role,
    settle_vllm_flags,
)
from jaxinfer.entrypoints.openai.weight_flags import add_weight_args, check_weight_flags
from jaxinfer.speculative.config import SpeculativeConfig
from jaxinfer.speculative.vllm_config import from_vllm

if TYPE_CHECKING:  # imported when serving: StartingApp needs the serve extra, which `jaxinfer --help` must not
    from jaxinfer import LLM
    from jaxinfer.entrypoints.openai.app import ServerConfig
    from jaxinfer.entrypoints.openai.shadow import ShadowRouter
    from jaxinfer.entrypoints.openai.shadow_stats import ShadowSettings
    from jaxinfer.entrypoints.openai.startup import StartingApp


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    """The `serve` subcommand and its flags (engine knobs default to LLM's)."""
    serve = sub.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over HTTP: /v1/completions, /v1/chat/completions (or with --runner pooling "
        "/v1/embeddings, /classify, /v1/score, /rerank), /v1/models, "
        "/tokenize, /detokenize, /health (503 while the model loads and compiles) and Prometheus /metrics. "
        "Needs the serve extra: pip install 'jaxinfer[serve]'.",
    )
    add_server_args(serve)
    add_engine_args(serve)
    add_parallel_args(serve)
    add_quantization_args(serve)
    add_memory_args(serve)
    add_speculative_args(serve)
    add_bounds_args(serve)
    add_shadow_args(serve)
    add_lora_args(serve)
    add_weight_args(serve)
    add_chat_args(serve)
    add_input_args(serve)
    add_startup_args(serve)
    add_vllm_flags(serve)
    add_http_flags(serve)
    add_generation_flags(serve)
    serve.set_defaults(run=run_serve)


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


def json_object(text: str | None, flag: str, example: str) -> dict | None:
    """A flag's JSON object (its fields are checked where they are used); None when the flag is not given."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{flag} must be a JSON object, got {text!r} ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object such as '{example}', got {text!r}")
    return value


def pooler_config(text: str | None) -> dict | None:
    """--pooler-config's JSON object (its fields are checked by LLM's PoolerConfig)."""
    return json_object(text, "--pooler-config", '{"pooling_type": "MEAN"}')


def limit_mm_per_prompt(text: str | None) -> dict | None:
    """--limit-mm-per-prompt's JSON object (its values are checked by LLM)."""
    return json_object(text, "--limit-mm-per-prompt", '{"image": 2}')


def speculative_config(args: argparse.Namespace) -> SpeculativeConfig | None:
    """The server's speculation: --speculative-config's JSON object (vLLM's keys, `speculative.vllm_config`), or
    --speculative-method with --speculative-model and --num-speculative-tokens; None for neither."""
    settings = json_object(args.speculative_config, "--speculative-config", '{"method": "ngram"}')
    if settings is not None:
        if args.speculative_method is not None or args.speculative_model is not None:
            raise ValueError("--speculative-config holds the whole setting (vLLM's flag): give it alone, without "
                             "--speculative-method / --speculative-model / --num-speculative-tokens")
        return from_vllm(settings, "--speculative-config")
    if args.speculative_method is None:
        return None
    return SpeculativeConfig(method=args.speculative_method, draft_model=args.speculative_model,
                             num_speculative_tokens=args.num_speculative_tokens)


def _check(args: argparse.Namespace) -> None:
    settle_vllm_flags(args)
    uvicorn_options(args)
    check_generation_flags(args)
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
    given, method = args.speculative_model is not None, args.speculative_method
    if (method in ("draft", "eagle")) != given and not (given and method in ("mtp", "deepseek_mtp")):
        raise ValueError("--speculative-model DIR goes with --speculative-method draft or eagle (or mtp, for a Gemma 4 "
                         "assistant), and only with them")
    if args.speculative_model is not None:
        validation.model_dir(args.speculative_model, "--speculative-model")
    speculative = speculative_config(args)
    if args.speculative_config is not None and speculative.draft_model is not None:
        validation.model_dir(speculative.draft_model, "--speculative-config's model")
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
        args.enable_weight_updates, cors_settings(args), args.chat_template_content_format, root_path(args),
        args.enable_request_id_headers, response_role=response_role(args),
        return_tokens_as_token_ids=args.return_tokens_as_token_ids, request_log=request_log(args),
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
        raise ValueError(f"jaxinfer serve needs the serve extra ({error.name} is missing): "
                         "pip install 'jaxinfer[serve]'") from None
    if args.enable_log_requests or args.enable_log_outputs:
        print_request_log()
    signals = StopSignals()
    signals.install()  # first: a signal from now on ends the start at once (exit 0)
    server_config = _server_config(args, "")  # the bounds' flags checked before anything is bound or loaded
    sock = bind(args.host, args.port)  # before minutes of loading: a taken port fails now
    starting = StartingApp(root_path=server_config.root_path)
    # lifespan off: the app starts as StartingApp, and the real one registers no lifespan events.
    options = uvicorn_options(args)
    config = uvicorn.Config(starting, log_level=args.log_level, timeout_graceful_shutdown=5, lifespan="off", **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), name="uvicorn", daemon=True)
    thread.start()
    host, port = sock.getsockname()[:2]
    url = f"{'https' if 'ssl_certfile' in options else 'http'}://{f'[{host}]' if ':' in host else host}:{port}"
    starting.say(f"listening on {url}; GET /health answers 503 until the model is ready")
    if exposed_without_key(args.host, args.api_key):
        starting.say(f"warning: --host {args.host} answers other machines and no --api-key is set: anyone who "
                     "reaches the port can use the model; set --api-key (or $JAXINFER_API_KEY)")
    try:
        llm, kwargs = _load(args, starting)
        name = args.served_model_name or llm.model_dir.name
        check_served_name(server_config.lora_modules, name)
        shadow = _shadow(llm, kwargs, shadow_settings(args), starting)
        served = dataclasses.replace(server_config, model_name=name, **served_defaults(args, llm.model_dir))
        app = build_app(llm, served, shadow)
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
    from jaxinfer import LLM

    speculative = speculative_config(args)
    starting.phase("loading the model")
    kwargs = dict(
        model=args.model, dtype=args.dtype, max_seq_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, num_pages=args.num_pages, page_size=args.page_size,
        decode_steps=args.decode_steps, stream_interval=args.stream_interval,
        enable_prefix_caching=prefix_caching(args), speculative=speculative, seed=args.seed, tokenizer=args.tokenizer,
        scheduling_policy=args.scheduling_policy,
        tensor_parallel_size=args.tp, data_parallel_size=args.dp, expert_parallel_size=args.ep,
        quantization=args.quantization, quantize_lm_head=args.quantize_lm_head, kv_cache_dtype=args.kv_cache_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization, batch_invariant=args.batch_invariant,
        enable_lora=args.enable_lora, max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
        runner=args.runner, pooler_config=pooler_config(args.pooler_config),
        limit_mm_per_prompt=limit_mm_per_prompt(args.limit_mm_per_prompt),
        allowed_local_media_path=args.allowed_local_media_path, enable_prompt_embeds=args.enable_prompt_embeds,
        kv_offloading_size=args.kv_offloading_size,
    )
    llm = LLM(**kwargs)
    if args.chat_template is not None:  # the server renders every chat through the tokenizer's template
        llm.get_tokenizer().chat_template = args.chat_template
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

