"""`jaxinfer serve`: its flags, and loading, warming and serving a model with uvicorn."""

from __future__ import annotations

import argparse
import os
import sys

from jaxinfer.config import validation
from jaxinfer.entrypoints.cli_args import add_parallel_args, add_quantization_args

DEFAULT_PORT = 8000


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    """The `serve` subcommand and its flags (engine knobs default to LLM's)."""
    serve = sub.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over HTTP: /v1/completions, /v1/chat/completions, /v1/models, "
        "/tokenize, /detokenize, /health and Prometheus /metrics. Needs the serve extra: pip install 'jaxinfer[serve]'.",
    )
    serve.add_argument("--model", default=None, help="HF or converted model directory (default: the demo model)")
    serve.add_argument("--served-model-name", default=None, help="the name clients pass as `model` (default: the directory name)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 exposes the server to the network (default: %(default)s)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (default: %(default)s)")
    serve.add_argument("--api-key", default=os.environ.get("JAXINFER_API_KEY"),
                       help="require `Authorization: Bearer KEY` on /v1 routes (default: $JAXINFER_API_KEY, else none)")
    serve.add_argument("--max-model-len", type=int, default=None, help="longest prompt + completion in tokens (default: the model's, <= 2048)")
    serve.add_argument("--dtype", default="auto", help="auto (the checkpoint's), float32, bfloat16 or float16 (default: %(default)s)")
    serve.add_argument("--max-num-seqs", type=int, default=64, help="sequences decoded together per step (default: %(default)s)")
    serve.add_argument("--max-num-batched-tokens", type=int, default=512, help="tokens per step; longer prompts are prefilled in chunks (default: %(default)s)")
    serve.add_argument("--num-pages", type=int, default=None, help="KV-cache pages in the pool (default: room for half of max-num-seqs at full length)")
    serve.add_argument("--page-size", type=int, default=16, help="tokens per KV-cache page, a power of two (default: %(default)s)")
    serve.add_argument("--decode-steps", type=int, default=8, help="decode steps per device call when nothing waits (default: %(default)s)")
    add_parallel_args(serve)
    add_quantization_args(serve)
    serve.add_argument("--no-prefix-caching", action="store_true", help="do not reuse the KV pages of shared prompt prefixes")
    serve.add_argument("--speculative-method", choices=["ngram", "draft", "eagle"], default=None,
                       help="speculate inside the engine: ngram proposes what followed the last n tokens "
                       "earlier in the prompt and output (no second model), draft runs --speculative-model, "
                       "eagle the EAGLE head in --speculative-model over the target's hidden states; "
                       "outputs keep the target's distribution (greedy: identical)")
    serve.add_argument("--speculative-model", default=None,
                       help="for --speculative-method draft: a draft model directory (same tokenizer as --model); "
                       "for eagle: an EAGLE-1 or EAGLE-3 head directory")
    serve.add_argument("--num-speculative-tokens", type=int, default=4,
                       help="drafts per sequence and step at most, 1-32, with --speculative-method (default: %(default)s)")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413 (default: %(default)s)")
    serve.add_argument("--skip-warmup", action="store_true", help="start at once and compile on first use instead of ahead of time")
    serve.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                       help="uvicorn's log level; info logs every request (default: %(default)s)")
    serve.set_defaults(run=run_serve)


def _check(args: argparse.Namespace) -> None:
    validation.integer(args.port, "--port", 0, 65535)
    validation.integer(args.max_body_bytes, "--max-body-bytes", 1)
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key is empty; give a key or leave the flag out")
    if (args.speculative_method in ("draft", "eagle")) != (args.speculative_model is not None):
        raise ValueError("--speculative-model DIR goes with --speculative-method draft or eagle, and only with them")
    if args.speculative_model is not None:
        validation.model_dir(args.speculative_model, "--speculative-model")


def run_serve(args: argparse.Namespace) -> int:
    """Load the model, compile its step shapes, and serve until interrupted."""
    _check(args)
    try:
        import uvicorn

        from jaxinfer.entrypoints.openai.app import ServerConfig, build_app
    except ImportError as error:
        raise ValueError(f"jaxinfer serve needs the serve extra ({error.name} is missing): pip install 'jaxinfer[serve]'") from None
    from jaxinfer import LLM, SpeculativeConfig

    speculative = None
    if args.speculative_method is not None:
        speculative = SpeculativeConfig(
            method=args.speculative_method, draft_model=args.speculative_model,
            num_speculative_tokens=args.num_speculative_tokens,
        )
    print("jaxinfer: loading the model", file=sys.stderr, flush=True)
    llm = LLM(
        args.model, dtype=args.dtype, max_seq_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, num_pages=args.num_pages, page_size=args.page_size,
        decode_steps=args.decode_steps, enable_prefix_caching=not args.no_prefix_caching, speculative=speculative,
        tensor_parallel_size=args.tp, data_parallel_size=args.dp, expert_parallel_size=args.ep,
        quantization=args.quantization, quantize_lm_head=args.quantize_lm_head, kv_cache_dtype=args.kv_cache_dtype,
    )
    if not args.skip_warmup:
        print("jaxinfer: compiling the engine's step shapes (once per machine with the compile cache)", file=sys.stderr, flush=True)
        count = llm.engine.warmup(progress=True)
        print(f"jaxinfer: {count} step programs ready", file=sys.stderr, flush=True)
    name = args.served_model_name or llm.model_dir.name
    app = build_app(llm, ServerConfig(name, args.api_key, args.max_body_bytes))
    print(f"jaxinfer: serving `{name}` at http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0
