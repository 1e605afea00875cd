"""Engine warm-up time with one compile thread against several, each in a fresh process.

Every setting loads the same checkpoint in its own interpreter with the persistent compile cache
off, so each compiles every program its knobs allow, then runs a short greedy workload to
check that nothing compiles after the warm-up. Prints a table and writes JSON. With --cold-warm
each thread count runs three times over one fresh persistent cache: the first compiles (cold),
the second finds its programs in JAX's compilation cache with the program store off (each
traced and lowered first: "xla"), the third loads them from the program store untraced
("store"). Each row splits its time: loading the model, then warm-up's tracing and lowering on
the calling thread and its compiles or loads summed over the workers, and counts the programs
that came from the store.

    python scripts/bench_warmup.py                                  # demo model, CPU: 1 vs 2 threads
    python scripts/bench_warmup.py --preset llama-3.2-1b --threads 1 8   # on a GPU
    python scripts/bench_warmup.py --preset llama-3.2-1b --threads 8 --max-seq-len 2048 \
        --max-num-seqs 64 --max-num-batched-tokens 512 --cold-warm  # issue 52's targets, default knobs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ONE_RUN = """
import json, sys, time
from jax import monitoring
from jaxinfer import LLM, SamplingParams
model, threads, seqs, tokens, seq_len = sys.argv[1] or None, *map(int, sys.argv[2:6])
cache = sys.argv[6] or False
loading = time.perf_counter()
llm = LLM(model, dtype="bfloat16", max_seq_len=seq_len, max_num_seqs=seqs, max_num_batched_tokens=tokens,
          compile_cache=cache)
start = time.perf_counter()
programs = llm.engine.warmup(threads=threads)
seconds = time.perf_counter() - start
split = llm.engine.runner.warmup_seconds
compiles = []
monitoring.register_event_duration_secs_listener(
    lambda name, *a, **k: compiles.append(name) if name.endswith("backend_compile_duration") else None)
llm.generate([[5] * 40, [7] * 90], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
print(json.dumps(dict(threads=threads, programs=programs, seconds=seconds, compiles_after=len(compiles),
                      load_s=start - loading, trace_s=split["trace"], compile_s=split["compile"],
                      stored=split["stored"])))
"""


def run(model: str, threads: int, args: argparse.Namespace, cache: str = "", store: bool = True) -> dict:
    """One fresh interpreter's warm-up, as a dict (cache: a persistent compile cache directory, "" for none;
    store: the program store beside it on)."""
    knobs = [args.max_num_seqs, args.max_num_batched_tokens, args.max_seq_len]
    command = [sys.executable, "-c", ONE_RUN, model, str(threads), *map(str, knobs), cache]
    env = {**os.environ, "JAXINFER_PROGRAM_STORE": "1" if store else "0"}
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def runs(model: str, threads: int, args: argparse.Namespace) -> list[dict]:
    """The runs of one thread count: one without a cache, or over a fresh one: cold, warm with JAX's
    compilation cache alone (every program traced), warm with the program store (none traced)."""
    if not args.cold_warm:
        return [run(model, threads, args)]
    with tempfile.TemporaryDirectory() as cache:
        return [dict(run(model, threads, args, cache, store), cache=kind)
                for kind, store in (("cold", True), ("xla", False), ("store", True))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=None, help="random-weight model of this shape (default: the demo model)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-num-batched-tokens", type=int, default=128)
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--cold-warm", action="store_true",
                        help="per thread count, a cold then a warm run over one fresh persistent compile cache")
    parser.add_argument("--checkpoints", type=Path, default=Path("/tmp/jaxinfer_bench"))
    parser.add_argument("--out", type=Path, default=Path("results/bench_warmup.json"))
    args = parser.parse_args()
    model = ""
    if args.preset:
        from bench_decode import make_checkpoint

        model = str(make_checkpoint(args.preset, args.checkpoints))
    print(f"{'threads':>7} {'cache':>5} {'programs':>8} {'seconds':>8} {'vs first':>8} {'compiles after':>14} "
          f"{'load s':>6} {'trace s':>7} {'compile s':>9} {'stored':>6}", flush=True)
    rows: list[dict] = []
    for threads in args.threads:  # each row as it finishes: a run cut short keeps the earlier ones
        for r in runs(model, threads, args):
            rows.append(r)
            ratio = rows[0]["seconds"] / r["seconds"]
            print(f"{r['threads']:>7} {r.get('cache', '-'):>5} {r['programs']:>8} {r['seconds']:>8.1f} {ratio:>8.2f} "
                  f"{r['compiles_after']:>14} {r['load_s']:>6.1f} {r['trace_s']:>7.1f} {r['compile_s']:>9.1f} "
                  f"{r['stored']:>6}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(preset=args.preset, time=time.strftime("%Y%m%d-%H%M%S"), rows=rows), indent=2))


if __name__ == "__main__":
    main()
