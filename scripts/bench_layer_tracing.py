"""Tracing, lowering and compile time of engine step programs: each decoder layer traced once
(`models.layer_calls`, the default) against every layer traced on its own (the unrolled loop
before it), in one run.

A warm start loads compiled programs from the persistent cache but must still trace and lower
every one of them to find its cache key, so the trace time is what a warm start pays; the
compile time (the persistent cache off) is what a cold one adds. Both variants compile to the
same unrolled program (XLA inlines the shared layer function), so step speed is unchanged.
Prints a table and writes JSON.

    python scripts/bench_layer_tracing.py                         # the demo model (6 layers)
    python scripts/bench_layer_tracing.py --preset llama-3.2-1b   # 16 layers, random weights
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax

from jaxinfer import LLM
from jaxinfer.models import decoder


def per_layer_call(layer_fn, cfg, x, cache, lw, layer, positions, rope):
    """The loop body before layer_calls: each layer traced where it is called."""
    return layer_fn(cfg, x, cache, lw, layer, positions, rope)


def time_programs(llm: LLM, count: int, compile_too: bool) -> dict:
    """Median seconds to lower (trace + MLIR) and to compile the engine's first `count` step programs."""
    runner = llm.engine.runner
    makers = runner.programs(llm.engine.step_hosts())[:count]
    lowers, compiles = [], []
    for make in makers:
        function, args, kwargs = make()
        start = time.perf_counter()
        lowered = function.lower(*args, **kwargs)
        lowers.append(time.perf_counter() - start)
        if compile_too:
            start = time.perf_counter()
            lowered.compile()
            compiles.append(time.perf_counter() - start)
    return dict(programs=len(makers), lower_s=statistics.median(lowers),
                compile_s=statistics.median(compiles) if compiles else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=None, help="random-weight model of this shape (default: the demo model)")
    parser.add_argument("--programs", type=int, default=4, help="step programs timed (the first of the engine's)")
    parser.add_argument("--no-compile", action="store_true", help="time tracing and lowering only")
    parser.add_argument("--checkpoints", type=Path, default=Path("/tmp/jaxinfer_bench"))
    parser.add_argument("--out", type=Path, default=Path("results/bench_layer_tracing.json"))
    args = parser.parse_args()
    model = None
    if args.preset:
        from bench_decode import make_checkpoint

        model = str(make_checkpoint(args.preset, args.checkpoints))
    llm = LLM(model, dtype="bfloat16", max_seq_len=512, max_num_seqs=8, max_num_batched_tokens=128,
              compile_cache=False)
    shared_call = decoder.call_layer
    variants = (("once", shared_call), ("per layer", per_layer_call))
    rows = []
    print(f"{'layers traced':>14} {'programs':>8} {'lower s':>8} {'compile s':>9}", flush=True)
    for round_ in range(2):  # the first round also pays jax's one-time costs: the second is reported
        for name, call in variants:
            decoder.call_layer = call
            jax.clear_caches()  # jit keeps traces by argument shapes, blind to the swapped loop body
            timed = time_programs(llm, args.programs, not args.no_compile and round_ == 1)
            if round_ == 1:
                rows.append(dict(variant=name, layers=llm.engine.runner.model_config.num_layers, **timed))
                compiled = "-" if timed["compile_s"] is None else f"{timed['compile_s']:.2f}"
                print(f"{name:>14} {timed['programs']:>8} {timed['lower_s']:>8.2f} {compiled:>9}", flush=True)
    decoder.call_layer = shared_call
    print(f"lowering: per layer / once = {rows[1]['lower_s'] / rows[0]['lower_s']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(preset=args.preset, time=time.strftime("%Y%m%d-%H%M%S"), rows=rows),
                                   indent=2))


if __name__ == "__main__":
    main()
