"""The flags of `jaxinfer serve` by concern (engine knobs default to LLM's); entrypoints/openai/launch reads them."""

from __future__ import annotations

import argparse
import os

from jaxinfer.entrypoints.openai.reasoning import PARSERS
from jaxinfer.entrypoints.openai.tool_parsers import TOOL_PARSERS

DEFAULT_PORT = 8000
DEFAULT_SHUTDOWN_TIMEOUT = 25.0  # below Kubernetes' 30 s grace period, leaving time to abort and exit


def add_server_args(serve: argparse.ArgumentParser) -> None:
    """The model served, its name, where it listens and who may call it."""
    serve.add_argument("--model", default=None, help="HF or converted model directory (default: the demo model)")
    serve.add_argument("--served-model-name", default=None,
                       help="the name clients pass as `model` (default: the directory name)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind; 0.0.0.0 exposes the server to the network (default: %(default)s)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT,
                       help="TCP port, bound before the model loads; 0 picks a free one (default: %(default)s)")
    serve.add_argument("--api-key", default=os.environ.get("JAXINFER_API_KEY"),
                       help="require `Authorization: Bearer KEY` on every route but /health (default: "
                       "$JAXINFER_API_KEY, which unlike the flag other users cannot read in the process list; "
                       "else none)")
    serve.add_argument("--metrics-without-key", action="store_true",
                       help="with --api-key: serve /metrics without the key (for a Prometheus scraper)")


def add_engine_args(serve: argparse.ArgumentParser) -> None:
    """The engine's batching and KV-cache knobs (LLM's defaults), prefix caching and batch invariance."""
    serve.add_argument("--max-model-len", type=int, default=None,
                       help="longest prompt + completion in tokens (default: the model's, <= 2048)")
    serve.add_argument("--dtype", default="auto",
                       help="auto (the checkpoint's), float32, bfloat16 or float16 (default: %(default)s)")
    serve.add_argument("--max-num-seqs", type=int, default=64,
                       help="sequences decoded together per step (default: %(default)s)")
    serve.add_argument("--max-num-batched-tokens", type=int, default=512,
                       help="tokens per step; longer prompts are prefilled in chunks (default: %(default)s)")
    serve.add_argument("--num-pages", type=int, default=None,
                       help="KV-cache pages in the pool (default: what --gpu-memory-utilization leaves on a GPU or "
                       "TPU; on CPU room for half of max-num-seqs at full length)")
    serve.add_argument("--page-size", "--block-size", type=int, default=16,
                       help="tokens per KV-cache page, a power of two (default: %(default)s)")
    serve.add_argument("--decode-steps", type=int, default=8,
                       help="decode steps per device call when nothing waits (default: %(default)s)")
    serve.add_argument("--stream-interval", type=int, default=None,
                       help="decode steps per device call at most while a stream is in the batch (default: as "
                            "many as take 50 ms at the measured step time, so streamed tokens arrive at least that "
                            "often; 1: every token as it is made, at the cost of a host round trip per token)")
    serve.add_argument("--no-prefix-caching", "--no-enable-prefix-caching", action="store_true",
                       help="do not reuse the KV pages of shared prompt prefixes")
    serve.add_argument("--kv-offloading-size", type=float, default=None, metavar="GIB",
                       help="GiB of host memory keeping prefix-cache pages the KV pool evicts, copied back when a "
                       "later prompt starts with them (vLLM's flag; default: off)")
    serve.add_argument("--batch-invariant", action="store_true",
                       help="a request's tokens and logprobs bitwise the same whatever else is batched with it "
                       "(CPU only so far; slower: see docs/engine.md)")


def add_speculative_args(serve: argparse.ArgumentParser) -> None:
    """Speculative decoding inside the engine."""
    serve.add_argument("--speculative-method",
                       choices=["ngram", "ngram_device", "suffix", "draft", "eagle", "mtp", "deepseek_mtp"],
                       default=None,
                       help="speculate inside the engine: ngram proposes what followed the last n tokens "
                       "earlier in the prompt and output (no second model; ngram_device looks it up on the device, "
                       "several verify rounds a call), suffix the most frequent continuation in the "
                       "prompt, output and recent requests' outputs (suffix decoding), draft runs --speculative-model, "
                       "eagle the EAGLE head in --speculative-model over the target's hidden states, mtp "
                       "(deepseek_mtp) the MTP layer DeepSeek-V3 and GLM-4.5 checkpoints ship, or with "
                       "--speculative-model a Gemma 4 assistant over the target's K/V; "
                       "outputs keep the target's distribution (greedy: identical)")
    serve.add_argument("--speculative-model", default=None,
                       help="for --speculative-method draft: a draft model directory (same tokenizer as --model); "
                       "for eagle: an EAGLE-1 or EAGLE-3 head directory; for mtp (optional): a Gemma 4 assistant "
                       "(Gemma4AssistantForCausalLM) directory")
    serve.add_argument("--num-speculative-tokens", type=int, default=4,
                       help="drafts per sequence and step at most, 1-32, with --speculative-method "
                       "(default: %(default)s)")
    serve.add_argument("--speculative-config", default=None,
                       help="vLLM's flag: the whole setting as a JSON object of vLLM's speculative_config keys "
                       "(method, model, num_speculative_tokens, prompt_lookup_max/min, suffix_decoding_*) or "
                       "SpeculativeConfig's fields, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": "
                       "4}'; instead of the three flags above")


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


def add_chat_args(serve: argparse.ArgumentParser) -> None:
    """How chat replies are read: reasoning and tool calls, by model family."""
    serve.add_argument("--reasoning-parser", choices=list(PARSERS), default=None,
                       help="as vLLM's flag: chat replies carry the model's thinking (`<think> ... </think>` "
                       "and the like) as reasoning_content (and vLLM's newer `reasoning`), the rest as content, by "
                       "model family (docs/serving.md); e.g. deepseek_r1 (DeepSeek-R1, its distills, QwQ: text "
                       "before </think> is reasoning, <think> or not), qwen3 (reasoning only when <think> opens the "
                       "reply), openai_gptoss (GPT-OSS's harmony format: the analysis channel is reasoning, the "
                       "final channel content) (default: none, the reply is content)")
    serve.add_argument("--tool-call-parser", choices=list(TOOL_PARSERS), default=None,
                       help="as vLLM's flag: the format tool calls are read in from a chat reply with tool_choice "
                       "auto, by model family (docs/serving.md); openai (GPT-OSS's harmony calls) goes with "
                       "--reasoning-parser openai_gptoss (default: Hermes <tool_call> blocks, else Llama-3 JSON)")


def add_input_args(serve: argparse.ArgumentParser) -> None:
    """What the model runs as (generate or pooling) and the inputs it takes beside text."""
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


def add_startup_args(serve: argparse.ArgumentParser) -> None:
    """Warm-up, sessions restored before serving, and logging."""
    serve.add_argument("--skip-warmup", action="store_true",
                       help="start at once and compile on first use instead of ahead of time")
    serve.add_argument("--load-session", action="append", default=[], metavar="DIR",
                       help="restore a session saved by LLM.save_session into the prefix cache before serving: "
                       "requests whose prompts start with its prompt skip its prefill (repeatable)")
    serve.add_argument("--log-level", "--uvicorn-log-level", default="warning",
                       choices=["critical", "error", "warning", "info", "debug", "trace"],
                       help="uvicorn's log level (--uvicorn-log-level is vLLM's name); info logs every request "
                       "(default: %(default)s)")
