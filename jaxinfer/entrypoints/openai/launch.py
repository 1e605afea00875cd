"""`jaxinfer serve`: its flags; the port bound, then the model loaded and warmed while uvicorn answers 503."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import threading
from typing import TYPE_CHECKING

from jaxinfer.config import validation
from jaxinfer.entrypoints.cli_args import add_memory_args, add_parallel_args, add_quantization_args

if TYPE_CHECKING:  # imported when serving: StartingApp needs the serve extra, which `jaxinfer --help` must not
    from jaxinfer import LLM
    from jaxinfer.entrypoints.openai.shadow import ShadowRouter
    from jaxinfer.entrypoints.openai.shadow_stats import ShadowSettings
    from jaxinfer.entrypoints.openai.startup import StartingApp

DEFAULT_PORT = 8000


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    """The `serve` subcommand and its flags (engine knobs default to LLM's)."""
    serve = sub.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over HTTP: /v1/completions, /v1/chat/completions, /v1/models, "
        "/tokenize, /detokenize, /health (503 while the model loads and compiles) and Prometheus /metrics. "
        "Needs the serve extra: pip install 'jaxinfer[serve]'.",
    )
    serve.add_argument("--model", default=None, help="HF or converted model directory (default: the demo model)")
    serve.add_argument("--served-model-name", default=None, help="the name clients pass as `model` (default: the directory name)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 exposes the server to the network (default: %(default)s)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT,
                       help="TCP port, bound before the model loads; 0 picks a free one (default: %(default)s)")
    serve.add_argument("--api-key", default=os.environ.get("JAXINFER_API_KEY"),
                       help="require `Authorization: Bearer KEY` on /v1 routes (default: $JAXINFER_API_KEY, else none)")
    serve.add_argument("--max-model-len", type=int, default=None, help="longest prompt + completion in tokens (default: the model's, <= 2048)")
    serve.add_argument("--dtype", default="auto", help="auto (the checkpoint's), float32, bfloat16 or float16 (default: %(default)s)")
    serve.add_argument("--max-num-seqs", type=int, default=64, help="sequences decoded together per step (default: %(default)s)")
    serve.add_argument("--max-num-batched-tokens", type=int, default=512, help="tokens per step; longer prompts are prefilled in chunks (default: %(default)s)")
    serve.add_argument("--num-pages", type=int, default=None, help="KV-cache pages in the pool (default: what --gpu-memory-utilization leaves on a GPU or TPU; on CPU room for half of max-num-seqs at full length)")
    serve.add_argument("--page-size", type=int, default=16, help="tokens per KV-cache page, a power of two (default: %(default)s)")
    serve.add_argument("--decode-steps", type=int, default=8, help="decode steps per device call when nothing waits (default: %(default)s)")
    add_parallel_args(serve)
    add_quantization_args(serve)
    add_memory_args(serve)
    serve.add_argument("--no-prefix-caching", action="store_true", help="do not reuse the KV pages of shared prompt prefixes")
    serve.add_argument("--speculative-method", choices=["ngram", "suffix", "draft", "eagle"], default=None,
                       help="speculate inside the engine: ngram proposes what followed the last n tokens "
                       "earlier in the prompt and output (no second model), suffix the most frequent continuation in the "
                       "prompt, output and recent requests' outputs (suffix decoding), draft runs --speculative-model, "
                       "eagle the EAGLE head in --speculative-model over the target's hidden states; "
                       "outputs keep the target's distribution (greedy: identical)")
    serve.add_argument("--speculative-model", default=None,
                       help="for --speculative-method draft: a draft model directory (same tokenizer as --model); "
                       "for eagle: an EAGLE-1 or EAGLE-3 head directory")
    serve.add_argument("--num-speculative-tokens", type=int, default=4,
                       help="drafts per sequence and step at most, 1-32, with --speculative-method (default: %(default)s)")
    add_shadow_args(serve)
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413 (default: %(default)s)")
    serve.add_argument("--skip-warmup", action="store_true", help="start at once and compile on first use instead of ahead of time")
    serve.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                       help="uvicorn's log level; info logs every request (default: %(default)s)")
    serve.set_defaults(run=run_serve)


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


def _check(args: argparse.Namespace) -> None:
    validation.integer(args.port, "--port", 0, 65535)
    validation.integer(args.max_body_bytes, "--max-body-bytes", 1)
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key is empty; give a key or leave the flag out")
    if (args.speculative_method in ("draft", "eagle")) != (args.speculative_model is not None):
        raise ValueError("--speculative-model DIR goes with --speculative-method draft or eagle, and only with them")
    if args.speculative_model is not None:
        validation.model_dir(args.speculative_model, "--speculative-model")
    if args.model is not None:  # before the port is bound: a wrong path is one error line, nothing else
        validation.model_dir(args.model, "--model")
    shadow_settings(args)  # every --shadow-* value, before the port is bound


def run_serve(args: argparse.Namespace) -> int:
    """Bind the port, then load the model and compile its step shapes while /health answers 503,
    and serve until interrupted (Ctrl-C or SIGTERM)."""
    _check(args)
    try:
        import uvicorn

        from jaxinfer.entrypoints.openai.startup import StartingApp, bind

        sock = bind(args.host, args.port)  # before minutes of loading: a taken port fails now
        from jaxinfer.entrypoints.openai.app import ServerConfig, build_app
    except ImportError as error:
        raise ValueError(f"jaxinfer serve needs the serve extra ({error.name} is missing): pip install 'jaxinfer[serve]'") from None
    starting = StartingApp()
    # lifespan off: the app starts as StartingApp, and the real one registers no lifespan events.
    config = uvicorn.Config(starting, log_level=args.log_level, timeout_graceful_shutdown=5, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), name="uvicorn", daemon=True)
    thread.start()
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    starting.say(f"listening on {url}; GET /health answers 503 until the model is ready")
    _terminate_as_interrupt()
    try:
        llm, kwargs = _load(args, starting)
        name = args.served_model_name or llm.model_dir.name
        shadow = _shadow(llm, kwargs, shadow_settings(args), starting)
        starting.ready(build_app(llm, ServerConfig(name, args.api_key, args.max_body_bytes), shadow))
        starting.say(f"ready: serving `{name}` at {url}/v1")
        thread.join()
    except KeyboardInterrupt:
        starting.say("stopping")
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    return 0


def _load(args: argparse.Namespace, starting: StartingApp) -> tuple[LLM, dict]:
    """The model, loaded and (unless --skip-warmup) compiled, its progress told to `starting`; and its kwargs."""
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
        decode_steps=args.decode_steps, enable_prefix_caching=not args.no_prefix_caching, speculative=speculative,
        tensor_parallel_size=args.tp, data_parallel_size=args.dp, expert_parallel_size=args.ep,
        quantization=args.quantization, quantize_lm_head=args.quantize_lm_head, kv_cache_dtype=args.kv_cache_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    llm = LLM(**kwargs)
    if not args.skip_warmup:
        starting.phase("compiling step programs", "once per machine with the compile cache")
        count = llm.engine.warmup(on_program=starting.compiled)
        starting.say(f"{count} step programs ready")
    return llm, kwargs


def _shadow(llm: LLM, kwargs: dict, settings: ShadowSettings, starting: StartingApp) -> ShadowRouter | None:
    """The router: with shadowing, its reference loaded (on the served weights when it can); without,
    only for speculation's fallback when the server speculates; else None."""
    from jaxinfer.entrypoints.openai.shadow import ShadowRouter

    if settings.fraction == 0:
        return None if kwargs["speculative"] is None else ShadowRouter(llm, kwargs, settings)
    starting.phase("loading the shadow reference")
    router = ShadowRouter(llm, kwargs, settings)
    shared = "the served weights" if router.shares_weights else "a second copy of the model"
    checked = ", ".join(f"{name} ({kind})" for name, kind in router.optimizations.items()) or "nothing"
    starting.say(f"shadowing {settings.fraction:g} of requests on {shared}; validating {checked}")
    return router


def _terminate_as_interrupt() -> None:
    """SIGTERM stops the server as Ctrl-C does (uvicorn, on a thread here, cannot take signals)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.default_int_handler)
