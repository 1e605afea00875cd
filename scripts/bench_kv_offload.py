"""KV offloading to host memory: a conversation's second turn after other traffic evicted its first, served with
the host tier (`kv_offloading_size`) against recomputing the lost prefix (the engine without it), in one run.

Each round: turn 1 is a fresh `--prompt-tokens` prompt (16 tokens answered); `--others` prompts of the same length
then run one at a time in a pool that holds about one and a half prompts (`--pool-prompts`), evicting turn 1's
pages; turn 2 is turn 1's prompt and answer plus 8 tokens, timed to its first token (one decoded token: the same
for both). Both engines are warmed up first (nothing compiles while timed) and run the same rounds. Reported:
turn 2's median time, the prompt tokens it found cached, the ratio, and for the host tier the bytes copied back
and the share of turn 2 those bytes take at the host-to-device bandwidth measured in the same run (`device_put`
of 256 MiB).

    PYTHONPATH=.:scripts python scripts/bench_kv_offload.py                       # the demo model, CPU
    PYTHONPATH=.:scripts python scripts/bench_kv_offload.py --preset llama-3.2-1b --dtype bfloat16 \\
        --prompt-tokens 4096 --out results/bench_kv_offload.json                 # on a GPU
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from jaxinfer import DEMO_MODEL, LLM, SamplingParams

PAGE = 16
ANSWER = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
FIRST_TOKEN = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


def host_to_device_bandwidth(n_bytes: int = 1 << 28, repeats: int = 5) -> float:
    """Bytes/s of `jax.device_put` of a host array (the copy-back's physical bound)."""
    host = np.ones(n_bytes // 4, np.float32)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.device_put(host).block_until_ready()
        times.append(time.perf_counter() - start)
    return n_bytes / min(times)


def rounds(vocab: int, prompt_tokens: int, others: int, count: int, seed: int = 0) -> list[dict]:
    """Each round's turn-1 prompt, the prompts that evict it and turn 2's extra tokens (random ids)."""
    rng = np.random.default_rng(seed)
    ids = lambda n: rng.integers(3, vocab, n).tolist()  # noqa: E731
    return [dict(turn_1=ids(prompt_tokens), others=[ids(prompt_tokens) for _ in range(others)], extra=ids(8))
            for _ in range(count)]


def run(llm: LLM, work: list[dict]) -> dict:
    """Turn 2's seconds and cached prompt tokens per round, and the offload metrics' growth over the rounds."""
    before = llm.metrics()
    seconds, cached = [], []
    for r in work:
        answer = llm.generate([r["turn_1"]], ANSWER)[0].outputs[0].token_ids
        for other in r["others"]:  # one at a time: each takes the pages the least recently used prefix holds
            llm.generate([other], ANSWER)
        start = time.perf_counter()
        turn_2 = llm.generate([r["turn_1"] + answer + r["extra"]], FIRST_TOKEN)[0]
        seconds.append(time.perf_counter() - start)
        cached.append(turn_2.num_cached_tokens)
    after = llm.metrics()
    grown = {k: after[k] - before.get(k, 0) for k in after if k.startswith("kv_offload_") and "store" not in k}
    return dict(turn_2_s=seconds, cached_tokens=cached, **grown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a checkpoint directory (default: the demo model)")
    parser.add_argument("--preset", default=None, help="bench_decode's preset: a random-weight checkpoint of its shape")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompt-tokens", type=int, default=768)
    parser.add_argument("--others", type=int, default=2, help="prompts between the turns")
    parser.add_argument("--pool-prompts", type=float, default=1.5, help="the pool's size, in prompts")
    parser.add_argument("--offload-gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("results/bench_kv_offload.json"))
    args = parser.parse_args()
    model = args.model or DEMO_MODEL
    if args.preset:
        from bench_decode import make_checkpoint  # torch and transformers: only for a preset

        model = str(make_checkpoint(args.preset, Path(tempfile.gettempdir()) / "jaxinfer_bench_models"))
    max_len = -(-(args.prompt_tokens + 64) // PAGE) * PAGE
    pages = max(int(args.pool_prompts * args.prompt_tokens / PAGE), max_len // PAGE) + 1
    knobs = dict(dtype=args.dtype, max_seq_len=max_len, num_pages=pages)
    engines = {"recompute": LLM(model, **knobs), "host tier": LLM(model, kv_offloading_size=args.offload_gib, **knobs)}
    work = rounds(engines["recompute"].config.vocab_size, args.prompt_tokens, args.others, args.rounds)
    for llm in engines.values():
        llm.engine.warmup()
        run(llm, rounds(llm.config.vocab_size, args.prompt_tokens, args.others, 1, seed=1))  # first calls
    results = {name: run(llm, work) for name, llm in engines.items()}
    bandwidth = host_to_device_bandwidth()
    base = statistics.median(results["recompute"]["turn_2_s"])
    print(f"{jax.devices()[0].device_kind}; {Path(model).name} {args.dtype}; {args.prompt_tokens}-token turns, "
          f"a pool of {pages} pages; host-to-device {bandwidth / 1e9:.1f} GB/s")
    print(f"{'engine':<10} {'turn 2 ms':>10} {'cached':>7} {'vs recompute':>13} {'MB back':>8} {'copy share':>10}")
    for name, r in results.items():
        median = statistics.median(r["turn_2_s"])
        loaded = r.get("kv_offload_loaded_bytes", 0) / len(work)
        share = f"{loaded / bandwidth / median:.1%}" if loaded else "-"
        print(f"{name:<10} {median * 1e3:>10.1f} {statistics.median(r['cached_tokens']):>7.0f} "
              f"{base / median:>12.2f}x {loaded / 1e6:>8.2f} {share:>10}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = dict(model=str(model), dtype=args.dtype, prompt_tokens=args.prompt_tokens, pages=pages,
                  device=jax.devices()[0].device_kind, jax=jax.__version__, host=platform.node(),
                  host_to_device_bytes_per_s=bandwidth, results=results)
    args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
