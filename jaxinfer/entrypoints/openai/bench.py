"""`jaxinfer bench serve`: a serving benchmark against a running OpenAI-compatible server.

Sends a workload (random token-id prompts, a JSONL file of {"prompt", "max_tokens"}, or a
ShareGPT JSON file, whose first human turn is the prompt and whose gpt turn after it sets the
output length, as in vLLM) as streaming /v1/completions at a Poisson --request-rate and/or under --max-concurrency, and
reports vLLM's serving-benchmark fields with the same definitions: TTFT is request start to
the first streamed chunk with a choice (its text may be empty: a model without tokenizer files,
or a partial character), ITL the gaps between such chunks, TPOT = (e2el - ttft) /
(output_tokens - 1), throughputs over the whole run's wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from jaxinfer.entrypoints.openai.bench_data import (
    DATASET_NAMES,
    Work,
    jsonl_workload,
    random_workload,
    resolve_dataset_name,
    sharegpt_pairs,
    sharegpt_workload,
)


@dataclasses.dataclass
class Result:
    """What one request measured (seconds)."""

    ok: bool = False
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = dataclasses.field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str = ""


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """`bench serve` and its flags."""
    bench = sub.add_parser("bench", help="benchmarks (serve: load test a running server)")
    kinds = bench.add_subparsers(dest="bench", required=True)
    serve = kinds.add_parser("serve", help="vLLM-style serving benchmark against a running server",
                             description=__doc__.split("\n\n")[1].replace("\n", " "))
    serve.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (default: %(default)s)")
    serve.add_argument("--api-key", default=None, help="bearer token, if the server needs one")
    serve.add_argument("--model", default=None, help="model name to send (default: the server's first)")
    serve.add_argument("--dataset", "--dataset-path", type=Path, default=None,
                       help="a JSONL file ({prompt, max_tokens} per line) or a ShareGPT JSON file "
                            "(default: random prompts)")
    serve.add_argument("--dataset-name", choices=DATASET_NAMES, default=None,
                       help="format of --dataset; random takes none (default: detected, a JSON list is sharegpt)")
    serve.add_argument("--num-prompts", type=int, default=64, help="requests to send (default: %(default)s)")
    serve.add_argument("--input-len", type=int, default=128, help="mean random prompt length in tokens (default: %(default)s)")
    serve.add_argument("--output-len", type=int, default=64, help="mean random max_tokens (default: %(default)s)")
    serve.add_argument("--range-ratio", type=float, default=0.5, help="random lengths are uniform in len*(1±ratio) (default: %(default)s)")
    serve.add_argument("--max-token-id", type=int, default=1000, help="random prompt ids are drawn below this (default: %(default)s)")
    serve.add_argument("--request-rate", type=float, default=math.inf, help="Poisson arrivals per second (default: all at once)")
    serve.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once (default: unlimited)")
    serve.add_argument("--seed", type=int, default=0, help="workload and arrival seed (default: %(default)s)")
    serve.add_argument("--disable-tqdm", action="store_true", help="no progress bar on stderr")
    serve.add_argument("--result-file", type=Path, default=None, help="JSON output (default: results/bench_serve_<rate>_<concurrency>.json)")
    serve.set_defaults(run=run_bench)


async def send(client, url: str, model: str, work: Work) -> Result:
    """One streaming completion; greedy and ignore_eos so output lengths are the requested ones."""
    payload = {"model": model, "prompt": work.prompt, "max_tokens": work.max_tokens, "temperature": 0,
               "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    result, start = Result(), time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                return Result(error=f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Result(error=chunk["error"]["message"])
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if chunk["choices"]:  # tokens arrived, even where they decode to no text yet
                    now = time.perf_counter()
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
    except Exception as error:  # a failed request is counted, not fatal to the run
        return Result(error=f"{type(error).__name__}: {error}")
    result.e2el, result.ok = time.perf_counter() - start, True
    return result


async def run_workload(args: argparse.Namespace, workload: list[Work], model: str) -> tuple[list[Result], float]:
    """Send every request on schedule; returns the results and the run's wall time."""
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limit = asyncio.Semaphore(args.max_concurrency or len(workload))
    rng = np.random.default_rng(args.seed)
    url = args.base_url.rstrip("/") + "/v1/completions"
    timeout = httpx.Timeout(None)
    async with httpx.AsyncClient(headers=headers, timeout=timeout, limits=httpx.Limits(max_connections=None)) as client:

        bar = tqdm(total=len(workload), desc="requests", unit="req", disable=args.disable_tqdm, file=sys.stderr)

        async def limited(work: Work) -> Result:
            async with limit:
                result = await send(client, url, model, work)
            bar.update()
            return result

        start, tasks = time.perf_counter(), []
        for work in workload:
            tasks.append(asyncio.create_task(limited(work)))
            if math.isfinite(args.request_rate):
                await asyncio.sleep(rng.exponential(1.0 / args.request_rate))
        results = await asyncio.gather(*tasks)
        bar.close()
    return list(results), time.perf_counter() - start


def _stats(name: str, seconds: list[float]) -> dict[str, float]:
    values = np.asarray(seconds or [0.0]) * 1000
    return {f"mean_{name}_ms": float(values.mean()), f"median_{name}_ms": float(np.median(values)),
            f"p99_{name}_ms": float(np.percentile(values, 99))}


def summarize(results: list[Result], duration: float) -> dict:
    """vLLM's serving-benchmark fields from the per-request results."""
    ok = [r for r in results if r.ok]
    inputs, outputs = sum(r.prompt_tokens for r in ok), sum(r.output_tokens for r in ok)
    tpot = [(r.e2el - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "total_input_tokens": inputs, "total_output_tokens": outputs,
        "request_throughput": len(ok) / duration, "output_throughput": outputs / duration,
        "total_token_throughput": (inputs + outputs) / duration,
        **_stats("ttft", [r.ttft for r in ok]), **_stats("tpot", tpot),
        **_stats("itl", [gap for r in ok for gap in r.itl]), **_stats("e2el", [r.e2el for r in ok]),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }


def print_table(summary: dict) -> None:
    """The summary as a two-column table."""
    print("=" * 50)
    for key, value in summary.items():
        shown = f"{value:.2f}" if isinstance(value, float) else str(value)
        print(f"{key:<32}{shown:>18}")
    print("=" * 50)


def run_bench(args: argparse.Namespace) -> int:
    """Build the workload, run it, print the table and write the JSON."""
    if args.command == "bench" and args.bench != "serve":
        raise ValueError(f"unknown benchmark {args.bench!r}")
    workload, model = build_workload(args)
    results, duration = asyncio.run(run_workload(args, workload, model))
    summary = {"request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
               "num_prompts": len(workload), **summarize(results, duration)}
    print_table(summary)
    out = args.result_file or Path("results") / f"bench_serve_rate{args.request_rate}_conc{args.max_concurrency}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0 if summary["completed"] else 1


def build_workload(args: argparse.Namespace) -> tuple[list[Work], str]:
    """The requests and the model to send them to; a dataset file is read before the server is asked."""
    name = resolve_dataset_name(args.dataset_name, args.dataset)
    if name == "jsonl":
        workload = jsonl_workload(args.dataset, args.num_prompts)
    elif name == "sharegpt":
        pairs = sharegpt_pairs(args.dataset)
        model = args.model or _served_model(args)
        return sharegpt_workload(pairs, args.num_prompts, lambda text: _count_tokens(args, model, text)), model
    else:
        workload = random_workload(args.num_prompts, args.input_len, args.output_len, args.range_ratio,
                                   args.max_token_id, random.Random(args.seed))
    return workload, args.model or _served_model(args)


def _count_tokens(args: argparse.Namespace, model: str, text: str) -> int:
    """Tokens of text by the server's own tokenizer (POST /tokenize): a ShareGPT reply's output length."""
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    response = httpx.post(args.base_url.rstrip("/") + "/tokenize", json=body, headers=headers, timeout=30)
    if response.status_code != 200:
        raise ValueError(f"--dataset-name sharegpt: POST /tokenize answered {response.status_code}; "
                         "counting a reply's tokens needs a server with a tokenizer")
    return int(response.json()["count"])


def _served_model(args: argparse.Namespace) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = args.base_url.rstrip("/") + "/v1/models"
    try:
        response = httpx.get(url, headers=headers, timeout=30)
    except httpx.TransportError as error:
        raise ValueError(f"--base-url {args.base_url!r}: no server answers ({error}); is `jaxinfer serve` running?") from None
    if response.status_code != 200:
        raise ValueError(f"--base-url {args.base_url!r}: GET /v1/models answered {response.status_code}; check --api-key")
    return response.json()["data"][0]["id"]
