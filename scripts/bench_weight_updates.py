"""Weight updates and sleep mode: how long an RL loop waits between rollouts, against reloading the model.

A random-weight checkpoint of a preset's shape (bench_decode's presets) is served; each way of
getting new weights into the running LLM is timed (median of --repeats, each followed by a decode
call that must compile nothing) against two references measured in the same run:
- the baseline a loop has without updates: a new `LLM` on the checkpoint, to its first decoded token
  (loading and the programs a generate call needs, from a warm compilation cache);
- the physical bound: the served weights' bytes copied once at the device's measured copy bandwidth.

    python scripts/bench_weight_updates.py                                   # SmolLM-135M shape, CPU
    python scripts/bench_weight_updates.py --preset llama-3.2-1b --dtype bfloat16   # on a GPU

Rows: `pytree` (a trainer's params already on the devices, e.g. a JAX trainer's), `named host`
(HF-named NumPy arrays on the host, as a torch state_dict), `from disk` (`update_weights_from_disk`),
`sleep 1 + wake` (weights to host memory and back), `sleep 2 + disk` (discarded, read again), and
the device bytes sleep frees where the backend reports them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np
from bench_decode import PRESETS, make_checkpoint, measure_copy_bandwidth
from safetensors.numpy import load_file

from jaxinfer import LLM, SamplingParams
from jaxinfer.parallel.array_info import tree_bytes

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
PROMPT = list(range(10, 42))


def first_tokens(llm: LLM) -> list[int]:
    return llm.generate([PROMPT], GREEDY)[0].outputs[0].token_ids


def timed(fn: Callable[[], object], check: Callable[[], None], repeats: int) -> float:
    """Median seconds of fn() (all device work finished), each run followed by `check`."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        check()
    return statistics.median(times)


def host_tensors(path: Path) -> dict[str, np.ndarray]:
    """The checkpoint's tensors by name, in host memory (what a torch trainer's state_dict holds)."""
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="smollm-135m", choices=sorted(PRESETS))
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "jaxinfer_bench_models")
    parser.add_argument("--out", type=Path, default=Path("results/bench_weight_updates"))
    args = parser.parse_args()
    path = make_checkpoint(args.preset, args.model_dir)
    knobs = dict(dtype=args.dtype, max_seq_len=256, max_num_seqs=8)
    copy_bw = measure_copy_bandwidth()

    def fresh() -> LLM:
        llm = LLM(path, **knobs)
        first_tokens(llm)
        return llm

    fresh()  # compiles once: the baseline then reloads from a warm cache, as a loop's second rollout would
    start = time.perf_counter()
    llm = fresh()
    reload_s = time.perf_counter() - start
    expected = first_tokens(llm)
    weights_bytes = tree_bytes(llm._run_weights)
    compiles = []

    def check() -> None:
        before = llm.engine.runner.compiled_programs()
        if first_tokens(llm) != expected:
            raise SystemExit("decoded tokens changed after an update of the same weights")
        compiles.append(llm.engine.runner.compiled_programs() - before)

    def sync(tree) -> None:
        jax.block_until_ready(tree)

    on_device = jax.tree.map(lambda x: x + 0, llm.weights)  # a trainer's copy of the params on the devices
    named = host_tensors(path)
    freed = {}

    def sleep_wake() -> None:
        before = llm.engine.runner.device_bytes_in_use()
        llm.sleep(1)
        after = llm.engine.runner.device_bytes_in_use()
        if before is not None and after is not None:
            freed["level 1"] = before - after
        llm.wake_up()
        sync(llm._run_weights)

    rows = {
        "pytree": lambda: (llm.update_weights(on_device), sync(llm._run_weights)),
        "named host": lambda: (llm.update_weights(named), sync(llm._run_weights)),
        "from disk": lambda: (llm.update_weights_from_disk(path), sync(llm._run_weights)),
        "sleep 1 + wake": sleep_wake,
        "sleep 2 + disk": lambda: (llm.sleep(2), llm.wake_up(), llm.update_weights_from_disk(path),
                                   sync(llm._run_weights)),
    }
    bound_s = weights_bytes / copy_bw
    results = []
    print(f"device {jax.devices()[0].device_kind}; {args.preset} {args.dtype}: {weights_bytes / 1e9:.3f} GB of weights; "
          f"copy bandwidth {copy_bw / 1e9:.1f} GB/s (bound {bound_s * 1e3:.1f} ms); new LLM to first token "
          f"{reload_s:.2f} s")
    print(f"{'way':<16} {'seconds':>9} {'vs new LLM':>11} {'of bound':>9}")
    for name, fn in rows.items():
        seconds = timed(fn, check, args.repeats)
        results.append(dict(way=name, seconds=seconds, speedup_vs_reload=reload_s / seconds,
                            bound_fraction=bound_s / seconds))
        print(f"{name:<16} {seconds:>9.3f} {reload_s / seconds:>10.1f}x {bound_s / seconds:>8.1%}")
    if any(compiles):
        raise SystemExit(f"a decode call after an update compiled programs: {compiles}")
    print("decode calls after each update compiled 0 programs; sleep freed",
          {k: f"{v / 1e9:.2f} GB" for k, v in freed.items()} or "n/a (the backend reports no device memory)")
    args.out.mkdir(parents=True, exist_ok=True)
    record = dict(preset=args.preset, dtype=args.dtype, device=jax.devices()[0].device_kind, jax=jax.__version__,
                  weights_bytes=weights_bytes, copy_bandwidth=copy_bw, reload_seconds=reload_s, rows=results,
                  sleep_freed_bytes=freed)
    (args.out / f"{args.preset}_{args.dtype}.json").write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
