"""Where a decode step's time goes: a profiler trace of one `generate`, summarised by operation.

Warms up (compiles) a generate of the same shapes, traces a second one with `jax.profiler`, and
prints the device operations (GPU kernels; on CPU the XLA operations of its compute threads)
ranked by total time, with the count, mean and share of the busy time, plus the gaps: traced
wall time that no operation fills, split into short gaps (launches) and long ones (the host's
round trips between calls, syncs). Custom calls are named by their
target (`ffi_call:jaxinfer_int8_matmul`), read from the optimized HLO that XLA dumps for the run.
Writes the Perfetto trace (open it at ui.perfetto.dev) and the table as JSON under --out.

    PYTHONPATH=. python scripts/profile_decode.py --preset llama-3.2-1b --batch 1    # on a GPU
    PYTHONPATH=. python scripts/profile_decode.py --batch 1 --new-tokens 8          # demo model, CPU
    PYTHONPATH=. python scripts/profile_decode.py --preset smollm-135m --quantization int8   # CPU
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from bench_decode import PRESETS, make_checkpoint

from jaxinfer import DEMO_MODEL, LLM, SamplingParams
from jaxinfer.quantization import quantized_weight

NUMBERED = re.compile(r"(\.\d+)+$")  # fusion.12 and fusion.7 are one kind of operation
CPU_THREADS = ("tf_XLAPjRtCpuClient", "tf_XLAEigen")  # where XLA:CPU runs a program's operations
WRAPPERS = re.compile(r"^(ThunkExecutor::|ThreadpoolListener::|end: |while)")  # spans around operations
CUSTOM_CALL = re.compile(r'^\s*(?:ROOT )?%?(ffi_call[.\d]*) = .*custom_call_target="([^"]+)"')


def trace_events(trace_file: Path) -> list[dict]:
    data = json.load(gzip.open(trace_file))
    return data["traceEvents"] if isinstance(data, dict) else data


def device_spans(events: list[dict]) -> list[dict]:
    """Complete events of the device's work: GPU/TPU processes, else the CPU's XLA compute threads."""
    meta = [e for e in events if e.get("ph") == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    on_device = [e for e in spans if processes.get(e["pid"], "").startswith("/device:")]
    if on_device:
        return on_device
    return [e for e in spans if threads.get((e["pid"], e["tid"]), "").startswith(CPU_THREADS)
            and not WRAPPERS.match(e["name"])]


def merged_intervals(spans: list[dict]) -> list[tuple[float, float]]:
    """The spans' intervals (microseconds) merged where they overlap (streams or threads), in order."""
    merged: list[tuple[float, float]] = []
    for start, stop in sorted((e["ts"], e["ts"] + e["dur"]) for e in spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def busy_seconds(spans: list[dict]) -> float:
    """Union of the spans' intervals (overlapping streams or threads counted once)."""
    return sum(stop - start for start, stop in merged_intervals(spans)) / 1e6


def idle_gaps(spans: list[dict], long_us: float = 100.0) -> tuple[float, float, int]:
    """Idle time between the spans' union: (seconds in gaps under long_us, seconds in longer gaps,
    how many longer ones). Short gaps are launches; long ones the host's round trips and syncs."""
    merged = merged_intervals(spans)
    gaps = [b[0] - a[1] for a, b in zip(merged, merged[1:])]
    long = [g for g in gaps if g > long_us]
    return (sum(gaps) - sum(long)) / 1e6, sum(long) / 1e6, len(long)


def custom_call_targets(dump_dir: Path) -> dict[tuple[str, str], str]:
    """(module, ffi_call.N) -> custom call target, from XLA's dump of the optimized modules.

    Programs compiled twice under one name (other shapes) may number their calls differently:
    such names map to every target they had, joined by "|".
    """
    targets: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for path in dump_dir.glob("module_*after_optimizations.txt"):
        module = path.name.split(".")[1]
        for line in path.open():
            match = CUSTOM_CALL.match(line)
            if match:
                targets[module, match.group(1)].add(match.group(2))
    return {key: "|".join(sorted(names)) for key, names in targets.items()}


def operation_name(span: dict, targets: dict[tuple[str, str], str]) -> str:
    """The span's operation without its number; custom calls with their target."""
    name = NUMBERED.sub("", span["name"])
    target = targets.get((span.get("args", {}).get("hlo_module", ""), span["name"]))
    return f"{name}:{target}" if target else name


def summarise(spans: list[dict], top: int, targets: dict[tuple[str, str], str] | None = None) -> list[dict]:
    """Operations ranked by total time: name, count, total and mean microseconds."""
    totals: dict[str, list[float]] = collections.defaultdict(list)
    for e in spans:
        totals[operation_name(e, targets or {})].append(e["dur"])
    ranked = sorted(totals.items(), key=lambda kv: -sum(kv[1]))[:top]
    return [dict(name=name, count=len(d), total_us=float(sum(d)), mean_us=float(np.mean(d))) for name, d in ranked]


def model_path(args: argparse.Namespace) -> Path:
    if args.model is not None:
        return args.model
    if args.preset is None:
        return DEMO_MODEL
    return make_checkpoint(args.preset, Path(tempfile.gettempdir()) / "jaxinfer_bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=None, choices=sorted(PRESETS), help="random-weight model of this shape")
    parser.add_argument("--model", type=Path, default=None, help="a model directory (default: the demo model)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantization", default=None, choices=quantized_weight.MODES)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, default=Path("results/profile_decode"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="profile_decode_hlo") as dump_dir:
        # Read when the backend starts (the first computation in `profile`), so set here, not at import.
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump_dir} --xla_dump_hlo_as_text"
        profile(args, Path(dump_dir))


def profile(args: argparse.Namespace, dump_dir: Path) -> None:
    # No prefix cache: the traced call must run the warm-up's shapes (a hit shortens its prefill).
    llm = LLM(model_path(args), dtype=args.dtype, max_seq_len=args.prompt_len + args.new_tokens,
              enable_prefix_caching=False, quantization=args.quantization)
    prompts = np.random.RandomState(0).randint(3, 250, (args.batch, args.prompt_len)).tolist()
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True)
    llm.generate(prompts, params)  # compile outside the trace
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            start = time.perf_counter()
            llm.generate(prompts, params)
            wall = time.perf_counter() - start
        trace = next(Path(log_dir).rglob("perfetto_trace.json.gz"))
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copy(trace, args.out / f"b{args.batch}_perfetto_trace.json.gz")
    spans = device_spans(trace_events(args.out / f"b{args.batch}_perfetto_trace.json.gz"))
    busy = busy_seconds(spans)
    rows = summarise(spans, args.top, custom_call_targets(dump_dir))
    print(f"device {jax.devices()[0].device_kind}; batch {args.batch}, prompt {args.prompt_len}, "
          f"{args.new_tokens} new tokens")
    print(f"traced generate {wall * 1e3:.1f} ms; device busy {busy * 1e3:.1f} ms ({busy / wall:.0%}); "
          f"per new token {wall / args.new_tokens * 1e3:.2f} ms wall, {busy / args.new_tokens * 1e3:.2f} ms busy")
    short, long, count = idle_gaps(spans)
    print(f"idle between operations: {short * 1e3:.1f} ms in gaps under 100 us (launches), {long * 1e3:.1f} ms "
          f"in {count} longer ones (host round trips, syncs)")
    print(f"{'operation':<60} {'count':>6} {'total ms':>9} {'mean us':>9} {'of busy':>8}")
    for r in rows:
        print(f"{r['name'][:60]:<60} {r['count']:>6} {r['total_us'] / 1e3:>9.2f} {r['mean_us']:>9.1f} "
              f"{r['total_us'] / 1e6 / busy:>8.1%}")
    (args.out / f"b{args.batch}_summary.json").write_text(json.dumps(dict(
        device=jax.devices()[0].device_kind, batch=args.batch, wall_s=wall, busy_s=busy, short_gaps_s=short,
        long_gaps_s=long, long_gaps=count, rows=rows), indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
