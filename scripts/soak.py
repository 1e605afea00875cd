"""Soak a real `jaxinfer serve` with mixed traffic, then check that nothing was lost or leaked.

    python scripts/soak.py --duration 1200             # 20 minutes on the demo model
    python scripts/soak.py --model DIR --duration 10   # what CI runs (tests/test_soak.py)

It starts the server on 127.0.0.1 (loopback only: it never binds or calls anything else) with
n-gram speculation, sends mixed traffic (scripts/soak_traffic.py) from more workers than the
server has slots, for a warm-up phase and then the timed one, bounded in seconds and requests.
At the end (scripts/soak_report.py): every well-formed request (the warm-up's too) got a complete
answer or an error of its own, none was lost; the KV pages in use are back to 0; RSS (and device
memory where the server reports it) is within 5% of the post-warm-up baseline; a sample of greedy
answers equals `LLM.generate` run alone; SIGTERM stops the server with exit 0; programs compiled
after the warm-up are counted (a failure with --strict-compiles). The report goes to results/ as
JSON; the exit status is 0 when every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import sys
import time
from pathlib import Path

import httpx
from soak_report import checks, outcome_summary
from soak_server import ServerProcess
from soak_traffic import Traffic, run, run_each_kind

REPO = Path(__file__).resolve().parents[1]
CLIENT_TIMEOUT = 300  # seconds without an answer before a request counts as lost (a compile may take ~30)


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The soak's flags; bad values exit 2 with one line naming the flag."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--model", default=None, help="model directory (default: the demo model)")
    add("--dtype", default="float32", help="the server's dtype; float32 keeps greedy answers exact (default: %(default)s)")
    add("--duration", type=float, default=60.0, help="seconds of timed traffic after the warm-up (default: %(default)s)")
    add("--warm-seconds", type=float, default=15.0,
        help="seconds of the same traffic before the baseline is read (default: %(default)s)")
    add("--max-requests", type=int, default=1_000_000, help="requests of the timed phase at most (default: %(default)s)")
    add("--max-num-seqs", type=int, default=4, help="the server's slots (default: %(default)s)")
    add("--concurrency", type=int, default=None, help="client workers (default: 3 x --max-num-seqs)")
    add("--max-model-len", type=int, default=256, help="the server's context (default: %(default)s)")
    add("--max-waiting-requests", type=int, default=16, help="the server's queue bound (default: %(default)s)")
    add("--greedy-samples", type=int, default=32, help="greedy answers compared with LLM.generate (default: %(default)s)")
    add("--skip-warmup", action="store_true", help="start the server with --skip-warmup (compiles on first use)")
    add("--strict-compiles", action="store_true", help="fail when the server compiles after the warm-up")
    add("--seed", type=int, default=0, help="seed of the traffic's choices (default: %(default)s)")
    add("--output", default=None, help="JSON report path (default: results/soak-<time>.json)")
    args = parser.parse_args(argv)
    for name in ("duration", "warm_seconds", "max_requests", "max_num_seqs", "max_model_len", "greedy_samples"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.concurrency is not None and args.concurrency < 1:
        parser.error(f"--concurrency must be >= 1, got {args.concurrency}")
    args.concurrency = args.concurrency or 3 * args.max_num_seqs
    return args


def server_flags(args: argparse.Namespace) -> list[str]:
    """The served configuration: speculation on, tight bounds the traffic runs into on purpose."""
    flags = ["--dtype", args.dtype, "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
             "--max-num-batched-tokens", "128", "--decode-steps", "4", "--speculative-method", "ngram",
             "--num-speculative-tokens", "3", "--max-body-bytes", "65536", "--max-n", "4",
             "--max-waiting-requests", str(args.max_waiting_requests), "--write-timeout", "10",
             "--shutdown-timeout", "10"]
    flags += ["--model", args.model] if args.model else []
    return flags + (["--skip-warmup"] if args.skip_warmup else [])


async def traffic(url: str, key: str, args: argparse.Namespace, seconds: float, requests: int, seed: int,
                  greedy: list, each_kind: bool = False) -> list:
    """One phase of traffic (after every kind twice when `each_kind`); greedy answers go to `greedy`."""
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=CLIENT_TIMEOUT, limits=limits) as client:
        t = Traffic(client, random.Random(seed), args.max_model_len, 65536, 4, greedy)
        first = await run_each_kind(t, args.concurrency) if each_kind else []
        return first + await run(t, args.concurrency, seconds, requests)


def compare_greedy(args: argparse.Namespace, records: list, say) -> dict:
    """A sample of the server's greedy answers against `LLM.generate` alone (no speculation, one batch)."""
    from jaxinfer import LLM, SamplingParams

    sample = random.Random(args.seed).sample(records, min(args.greedy_samples, len(records)))
    if not sample:
        return {"compared": 0, "mismatches": 0, "examples": []}
    say(f"comparing {len(sample)} greedy answers with LLM.generate")
    llm = LLM(args.model, dtype=args.dtype, max_seq_len=args.max_model_len, max_num_seqs=args.max_num_seqs)
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for _, m, _ in sample]
    outputs = llm.generate([prompt for prompt, _, _ in sample], params)
    wrong = [(p, served, out.text) for (p, _, served), out in zip(sample, outputs) if out.text != served]
    examples = [{"prompt": p, "served": s, "generate": g} for p, s, g in wrong[:3]]
    return {"compared": len(sample), "mismatches": len(wrong), "examples": examples}


def soak(args: argparse.Namespace, say) -> dict:
    """Run the phases and the checks; the report."""
    key = secrets.token_hex(16)
    greedy_records: list = []
    with ServerProcess(server_flags(args), key, say) as server:
        say("warm-up: every kind twice, then random traffic")
        warm = asyncio.run(traffic(server.url, key, args, args.warm_seconds, 1_000_000, args.seed + 1, [], True))
        server.wait_idle()
        baseline = server.snapshot()
        say(f"warm-up: {len(warm)} requests; baseline RSS {baseline['rss'] / 2**20:.1f} MiB, "
            f"{baseline['compiles']:.0f} programs compiled; timed traffic for {args.duration:.0f} s")
        started = time.monotonic()
        outcomes = asyncio.run(traffic(server.url, key, args, args.duration, args.max_requests, args.seed,
                                       greedy_records))
        elapsed = time.monotonic() - started
        say(f"timed traffic: {len(outcomes)} requests in {elapsed:.1f} s")
        server.wait_idle()
        end = server.snapshot()
        exit_code = server.stop()
    summary = outcome_summary(outcomes)
    # The warm-up's requests are judged too: every kind at least twice, whatever the timed phase's draw.
    judged = outcome_summary(warm + outcomes)
    summary["problems"] = judged["problems"]
    memory = {"rss_baseline": baseline["rss"], "rss_end": end["rss"], "rss_max": server.rss_max,
              "rss_samples_mib": [round(r / 2**20, 1) for r in server.rss_series[:: max(1, len(server.rss_series) // 60)]]}
    if baseline.get("device") and end.get("device") is not None:
        memory["device_growth"] = (end["device"] - baseline["device"]) / baseline["device"]
    state = {"kv_cache_usage_perc": end["kv"], "running": end["running"], "waiting": end["waiting"],
             "exit_code": exit_code, "compiles_after_warmup": end["compiles"] - baseline["compiles"]}
    greedy = compare_greedy(args, greedy_records, say)
    found = checks(judged, memory, state, greedy, args.strict_compiles)
    return {"config": {**vars(args), "server_flags": server_flags(args)}, "seconds": round(elapsed, 1),
            "warmup_requests": len(warm), **summary, "memory": memory, "server": state, "greedy": greedy,
            "checks": found, "passed": all(c["passed"] for c in found.values())}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    began = time.monotonic()

    def say(message: str) -> None:
        print(f"soak [{time.monotonic() - began:6.0f} s]: {message}", file=sys.stderr, flush=True)

    report = soak(args, say)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(args.output) if args.output else REPO / "results" / f"soak-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str))
    for name, check in report["checks"].items():
        say(f"{'ok  ' if check['passed'] else 'FAIL'} {name}: {check['measured']}")
    latency = report["latency"]["all_ok"] or {}
    say(f"{report['requests']} requests in {report['seconds']} s: {report['results']}; "
        f"p50 {latency.get('p50_ms')} ms, p99 {latency.get('p99_ms')} ms; report {path}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
