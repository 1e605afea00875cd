"""Serving throughput: the engine vs HF transformers `generate` (static padded batches).

One workload for both: N requests, prompt lengths uniform in [32, 512], output lengths
uniform in [32, 256], fixed seed, ignore_eos, greedy. Prints output and total tokens/s, TTFT and
TPOT (mean/p50/p99), peak KV usage, preemptions, host ms per step, padding waste (token
positions the device computed beyond the scheduled ones, over the scheduled ones), host-to-device
input kB per step, the engine's program count, and the compute roofline: total tokens x 2 x
parameters over the matmul FLOP/s measured here in the model's dtype. Also the physical bound:
that compute time plus the time to read, at the read bandwidth measured here, the K/V every
decode step must read (each generated token reads its sequence's whole cache), the engine's
share of it, and the most any engine could beat HF by on this machine (HF's time over the
bound). Also a shared-prefix workload (requests sharing a long prefix) with prefix caching on
and off. Writes JSON.

    python scripts/bench_throughput.py                       # demo target + SmolLM-135M shape, CPU
    python scripts/bench_throughput.py --models smollm-135m --requests 64 --skip-hf
    python scripts/bench_throughput.py --models demo --skip-hf --kv-cache-dtype int8
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from bench_decode import make_checkpoint, measure_read_bandwidth

from jaxinfer import LLM, SamplingParams
from jaxinfer.engine.metrics import StepClock
from jaxinfer.entrypoints.llm import DEMO_MODEL
from jaxinfer.parallel.array_info import tree_bytes

RESULTS = Path(__file__).parents[1] / "results"


def workload(n: int, seed: int, vocab: int, prompt_range=(32, 512), output_range=(32, 256)):
    """(prompts, output lengths) drawn with a fixed seed."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, vocab, rng.integers(*prompt_range, endpoint=True)).tolist() for _ in range(n)]
    return prompts, rng.integers(*output_range, endpoint=True, size=n).tolist()


def matmul_flops(dtype: jnp.dtype) -> float:
    """FLOP/s of a jitted square matmul in dtype on random data (best of 5), float32 accumulation.

    2048 fills a CPU; an H200 reached 133 TFLOP/s there, about a sixth of what 8192 reaches.
    """
    size = 2048 if jax.default_backend() == "cpu" else 8192
    a = jax.random.normal(jax.random.key(0), (size, size), dtype)
    f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    f(a, a).block_until_ready()
    best = min(_timed(lambda: f(a, a).block_until_ready()) for _ in range(5))
    return 2 * size**3 / best


def kv_token_bytes(llm: LLM, kv_cache_dtype: str) -> int:
    """Bytes of K and V one token holds over all layers (8-bit pages: values plus a float32 scale per head)."""
    cfg = llm.config
    per_head = cfg.head_dim * jnp.dtype(llm.dtype).itemsize if kv_cache_dtype == "auto" else cfg.head_dim + 4
    return 2 * cfg.num_layers * cfg.num_kv_heads * per_head


def decode_kv_reads(prompts: list[list[int]], outputs: list[int], token_bytes: int) -> int:
    """K/V bytes the decode steps read: outputs after the first (prefill's), the j-th reading prompt + j tokens' K/V."""
    return token_bytes * sum((n - 1) * len(p) + n * (n - 1) // 2 for p, n in zip(prompts, outputs))


def physical_bound(row: dict) -> dict:
    """Seconds no engine beats here: matmuls at the measured peak plus decode K/V reads at the read bandwidth."""
    compute_s = row["total_tokens"] * 2 * row["params"] / row["matmul_flops"]
    kv_s = row["decode_kv_bytes"] / row["read_bandwidth"]
    bound = dict(compute_s=compute_s, kv_read_s=kv_s, seconds=compute_s + kv_s)
    bound["engine_fraction"] = bound["seconds"] / row["engine"]["seconds"]
    if "hf" in row:
        bound["hf_ceiling"] = row["hf"]["seconds"] / bound["seconds"]
    return bound


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def params_of(n: int) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=k, temperature=0, ignore_eos=True) for k in n]


def run_engine(llm: LLM, prompts, outputs, full_warmup: bool) -> dict:
    """Engine throughput and latencies once the workload's step shapes are compiled.

    full_warmup compiles every shape the knobs allow (`warmup()`, as `jaxinfer serve` does);
    otherwise an untimed pass of the same workload compiles the shapes it uses (the scheduler
    is deterministic, so the timed pass produces the same shapes).
    """
    start = time.perf_counter()
    if full_warmup:
        print(f"engine warm-up: {llm.engine.warmup()} programs", end=" ")
    else:
        llm.generate(prompts, params_of(outputs))
        llm.engine.reset_prefix_cache()  # no prefix hits from the warm-up pass
        print("engine warm-up pass", end=" ")
    print(f"{time.perf_counter() - start:.1f} s")
    before = llm.metrics()
    peak, start, requests = 0.0, time.perf_counter(), []
    for i, (p, k) in enumerate(zip(prompts, params_of(outputs))):
        llm.engine.add_request(f"bench-{i}", p, k)
        requests += llm.engine.groups[f"bench-{i}"]  # their timings (the engine keeps histograms only)
    while llm.engine.has_unfinished():
        llm.engine.step()
        peak = max(peak, llm.engine.blocks.usage)
    seconds = time.perf_counter() - start
    m = llm.metrics()
    steps = m["engine_steps"] - before["engine_steps"]
    step_seconds = m["engine_step_seconds"] - before["engine_step_seconds"]
    device_wait = m["engine_device_wait_seconds"] - before["engine_device_wait_seconds"]
    device_wait += m["engine_overlapped_seconds"] - before["engine_overlapped_seconds"]  # host work the device hid
    phases = {p: m["engine_phase_seconds"].get(p, 0.0) - before["engine_phase_seconds"].get(p, 0.0) for p in StepClock.PHASES}
    slots, real = (m[k] - before[k] for k in ("engine_token_slots", "engine_real_tokens"))
    return dict(
        programs=llm.engine.program_count(), padding_waste=slots / max(real, 1) - 1,
        input_kb_per_step=(m["engine_input_bytes"] - before["engine_input_bytes"]) / 1e3 / max(steps, 1),
        seconds=seconds, peak_kv_usage=peak,
        steps=steps, host_ms_per_step=1e3 * (step_seconds - device_wait) / max(steps, 1),
        host_share=(step_seconds - device_wait) / seconds,
        phase_ms_per_step={p: 1e3 * t / max(steps, 1) for p, t in phases.items()},
        preemptions=m["num_preemptions"] - before["num_preemptions"],
        ttft=_spread([r.timing.first_token - r.timing.arrival for r in requests]),
        tpot=_spread([
            (r.timing.last_token - r.timing.first_token) / (len(r.output_ids) - 1) for r in requests if len(r.output_ids) > 1
        ]),
        itl=_spread([gap for r in requests for gap in r.timing.token_gaps]),
    )


def _spread(samples: list[float]) -> dict:
    values = np.asarray(samples)
    return dict(mean=float(values.mean()), p50=float(np.percentile(values, 50)), p99=float(np.percentile(values, 99)))


def run_hf(path: Path, dtype: str, prompts, outputs, batch: int = 16, max_batches: int | None = None) -> dict:
    """HF transformers generate, left-padded static batches of `batch`, each to its longest output.

    max_batches times only the first batches and scales to all of them (the requests are drawn
    uniformly, so batches cost alike): on a 2-core CPU the SmolLM shape's 16 batches take ~50 min.
    """
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval().to(device)
    starts = list(range(0, len(prompts), batch))
    timed = starts[:max_batches] if max_batches else starts
    start = time.perf_counter()
    for i in timed:
        chunk, lens = prompts[i : i + batch], outputs[i : i + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(lens), min_new_tokens=max(lens),
                           do_sample=False, pad_token_id=0)
    seconds = time.perf_counter() - start
    return dict(seconds=seconds * len(starts) / len(timed), timed_batches=len(timed), batches=len(starts))


def shared_prefix(llm: LLM, vocab: int, n: int = 32, prefix: int = 1024) -> dict:
    """Mean TTFT of n requests sharing a prefix, with prefix caching on (warm) and off."""
    prefix = min(prefix, llm.max_seq_len - 32)  # the demo model holds 1024 positions in all
    rng = np.random.default_rng(1)
    common = rng.integers(3, vocab, prefix).tolist()
    prompts = [common + rng.integers(3, vocab, 16).tolist() for _ in range(n)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)

    def run(caching: bool) -> tuple[float, int]:
        llm.engine.reset_prefix_cache()
        if caching:
            llm.generate(prompts[:1], params)  # the shared prefix is now cached
        hits = llm.metrics()["prefix_cache_hits"]
        results = llm.generate(prompts, params)
        ttft = float(np.mean([r.metrics.time_to_first_token for r in results]))
        return ttft, llm.metrics()["prefix_cache_hits"] - hits

    out = {}
    for caching in (False, True):
        llm.engine.blocks.prefix_caching = caching
        run(caching)  # compiles exactly the step shapes of the timed run (the scheduler is deterministic)
        key = "on" if caching else "off"
        out[key], out[f"hit_tokens_{key}"] = run(caching)
    out["ratio"] = out["off"] / out["on"]
    return out


def bench_model(name: str, path: Path, dtype: str, args) -> dict:
    llm = LLM(path, dtype=dtype, max_seq_len=1024, max_num_seqs=args.max_num_seqs, decode_steps=args.decode_steps,
              kv_cache_dtype=args.kv_cache_dtype, page_size=args.page_size,
              gpu_memory_utilization=args.gpu_memory_utilization, overlap_outputs=not args.no_overlap,
              async_scheduling=not args.no_async)
    prompts, outputs = workload(args.requests, args.seed, llm.config.vocab_size)
    n_params = tree_bytes(llm.weights) // jnp.dtype(llm.dtype).itemsize
    total_tokens = sum(map(len, prompts)) + sum(outputs)
    flops = matmul_flops(llm.dtype)
    row = dict(model=name, dtype=dtype, kv_cache_dtype=args.kv_cache_dtype, page_size=args.page_size,
               requests=args.requests, decode_steps=args.decode_steps, params=int(n_params), output_tokens=sum(outputs),
               total_tokens=total_tokens, matmul_flops=flops, read_bandwidth=measure_read_bandwidth(1 << 29),
               decode_kv_bytes=decode_kv_reads(prompts, outputs, kv_token_bytes(llm, args.kv_cache_dtype)),
               engine=run_engine(llm, prompts, outputs, args.full_warmup))
    row["engine"]["roofline"] = total_tokens * 2 * n_params / row["engine"]["seconds"] / flops
    _progress(name, "engine", row)
    if not args.skip_hf:
        row["hf"] = run_hf(path, dtype, prompts, outputs, max_batches=args.hf_batches)
        _progress(name, "hf", row)
    row["bound"] = physical_bound(row)
    if args.shared_prefix:
        row["shared_prefix_ttft"] = shared_prefix(llm, llm.config.vocab_size)
    return row


def _progress(name: str, path: str, row: dict) -> None:
    """One line as each path finishes (a long run cut short still leaves its figures)."""
    seconds = row[path]["seconds"]
    print(f"{name} {path}: {seconds:.1f} s, {row['output_tokens'] / seconds:.0f} output tok/s"
          f"{_estimate_note(row[path])}", flush=True)


def _estimate_note(result: dict) -> str:
    """How a path's time was scaled from part of the batches ("" when all were timed)."""
    if result.get("timed_batches", 0) < result.get("batches", 0):
        return f"  estimated from {result['timed_batches']} of {result['batches']} batches"
    return ""


def print_row(row: dict) -> None:
    e, out = row["engine"], row["output_tokens"]
    print(f"\n{row['model']} ({row['dtype']}, KV pages {row['kv_cache_dtype']}, {row['params'] / 1e6:.1f}M params, "
          f"{row['requests']} requests, matmul {row['matmul_flops'] / 1e9:.0f} GFLOP/s)")
    print(f"{'path':<8} {'out tok/s':>10} {'total tok/s':>12} {'engine x':>9}")
    for path in ("engine", "hf"):
        if path in row:
            s = row[path]["seconds"]
            print(f"{path:<8} {out / s:>10.0f} {row['total_tokens'] / s:>12.0f} {s / e['seconds']:>9.2f}"
                  f"{_estimate_note(row[path])}")
    print(f"programs {e['programs']}  padding waste {e['padding_waste']:.1%} (padded token positions / real)  "
          f"host -> device {e['input_kb_per_step']:.1f} kB/step")
    print(f"roofline {e['roofline']:.1%}  peak KV {e['peak_kv_usage']:.0%}  preemptions {e['preemptions']}  "
          f"host {e['host_ms_per_step']:.1f} ms/step over {e['steps']} steps ({e['host_share']:.0%} of the time, "
          "not overlapped with the device)")
    print("ms/step by phase: " + "  ".join(f"{p} {ms:.2f}" for p, ms in e["phase_ms_per_step"].items()))
    print(f"TTFT mean/p50/p99 {e['ttft']['mean']:.3f}/{e['ttft']['p50']:.3f}/{e['ttft']['p99']:.3f} s  "
          f"TPOT {e['tpot']['mean'] * 1e3:.1f}/{e['tpot']['p50'] * 1e3:.1f}/{e['tpot']['p99'] * 1e3:.1f} ms  "
          f"ITL {e['itl']['mean'] * 1e3:.1f}/{e['itl']['p50'] * 1e3:.1f}/{e['itl']['p99'] * 1e3:.1f} ms "
          f"(decode_steps {row['decode_steps']})")
    b = row["bound"]
    ceiling = f"; HF's time over it {b['hf_ceiling']:.1f}x (the most any engine beats HF by here)" if "hf" in row else ""
    print(f"bound {b['seconds']:.1f} s = matmuls {b['compute_s']:.1f} s + decode K/V reads {b['kv_read_s']:.1f} s "
          f"({row['decode_kv_bytes'] / 1e9:.1f} GB at {row['read_bandwidth'] / 1e9:.1f} GB/s): engine at "
          f"{b['engine_fraction']:.0%} of it{ceiling}")
    if "shared_prefix_ttft" in row:
        sp = row["shared_prefix_ttft"]
        print(f"shared prefix TTFT: off {sp['off']:.3f} s, on {sp['on']:.3f} s ({sp['ratio']:.1f}x; "
              f"tokens served from the prefix cache: off {sp['hit_tokens_off']}, on {sp['hit_tokens_on']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["demo", "smollm-135m"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--page-size", type=int, default=16, help="tokens per KV page")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="share of an accelerator's memory for weights, activations and KV pages (default 0.9)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "int8", "fp8"],
                        help="the engine's KV pages")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--hf-batches", type=int, default=None,
                        help="time HF on the first N batches of 16 and scale to all (printed as estimated)")
    parser.add_argument("--shared-prefix", action="store_true")
    parser.add_argument("--full-warmup", action="store_true",
                        help="compile every program first (`warmup()`, as `jaxinfer serve` does) instead of an "
                        "untimed pass of the workload")
    parser.add_argument("--checkpoints", type=Path, default=Path("/tmp/jaxinfer-bench"))
    parser.add_argument("--no-overlap", action="store_true",
                        help="each step() lands its own call (overlap_outputs=False): the host share before it")
    parser.add_argument("--no-async", action="store_true",
                        help="no decode call starts before the one ahead lands (async_scheduling=False)")
    args = parser.parse_args()
    rows = []
    for name in args.models:
        path = DEMO_MODEL if name == "demo" else make_checkpoint(name, args.checkpoints)
        rows.append(bench_model(name, path, args.dtype, args))
        print_row(rows[-1])
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bench_throughput_{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(dict(args={k: str(v) for k, v in vars(args).items()}, rows=rows), indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
