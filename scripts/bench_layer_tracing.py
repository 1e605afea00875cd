"""Tracing, lowering and compile time of engine step programs: each decoder layer traced once
(`models.layer_calls`, the default) against every layer traced on its own (the unrolled loop
before it), in one run.

A warm start loads compiled programs from the persistent cache but must still trace and lower
every one of them to find its cache key, so the trace time is what a warm start pays; the
compile time (the persistent cache off) is what a cold one adds. The first two compile to the
same unrolled program (XLA inlines the shared layer function), so step speed is unchanged; the
scan variant is measured for its lowering and compile time only (it stacks the pools inside the
program, which a real scanned runtime would keep stacked), and for models whose layers are all
alike.
Prints a table and writes JSON.

    python scripts/bench_layer_tracing.py                         # the demo model (6 layers)
    python scripts/bench_layer_tracing.py --preset llama-3.2-1b   # 16 layers, random weights
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxinfer import LLM
from jaxinfer.cache.paged import LAYERED
from jaxinfer.models import decoder
from jaxinfer.models.layer_calls import FixedRope
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.registry import family_of
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN
from jaxinfer.runtime import flat_forward


def per_layer_call(layer_fn, cfg, x, cache, lw, layer, positions, rope):
    """The loop body before layer_calls: each layer traced where it is called."""
    return layer_fn(cfg, x, cache, lw, layer, positions, rope)


def scanned_forward_with_taps(weights, tokens, positions, cache, cfg, taps):
    """`decoder.forward_with_taps` as a `lax.scan` over stacked layer weights (`stack_layers`) and
    the pools stacked per field (every layer alike: one window, one rope)."""
    x = cache.layout.constrain(decoder.embed_tokens(weights, tokens, cfg), HIDDEN)
    tables = RopeTables(positions, cfg).for_layer(0)
    layer_fn, pages = family_of(cfg).layer, cache.pages
    fields = [name for name in LAYERED if getattr(pages, name) is not None]
    stacked = {name: jnp.stack(getattr(pages, name)) for name in fields}

    def body(x, layer):
        lw, pools = layer
        view = dataclasses.replace(cache, pages=dataclasses.replace(pages, **{n: [pools[n]] for n in fields}))
        x, view = layer_fn(cfg, x, view, lw, 0, positions, FixedRope(tables))
        return x, {n: getattr(view.pages, n)[0] for n in fields}

    x, pools = jax.lax.scan(body, x, (weights.layers, stacked))
    per_layer = {n: [pools[n][i] for i in range(cfg.num_layers)] for n in fields}
    cache = dataclasses.replace(cache, pages=dataclasses.replace(pages, **per_layer))
    return rms_norm(x, weights.final_norm, cfg.rms_norm_eps, cfg.norm_weight_offset), [], cache


def stack_layers(program: tuple) -> tuple:
    """A step program's arguments with the weights' layers stacked on a leading axis (for the scan)."""
    function, args, kwargs, _ = program
    weights = args[0]
    layers = jax.tree.map(lambda *leaves: jnp.stack(leaves), *weights.layers)
    return function, [dataclasses.replace(weights, layers=layers), *args[1:]], kwargs


def time_programs(llm: LLM, count: int, compile_too: bool, scan: bool = False) -> dict:
    """Median seconds to lower (trace + MLIR) and to compile the engine's first `count` step programs."""
    runner = llm.engine.runner
    makers = runner.programs(llm.engine.step_hosts())[:count]
    lowers, compiles = [], []
    for make in makers:
        function, args, kwargs = stack_layers(make()) if scan else make()[:3]
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
              compile_cache=False, cpu_kernels=False)
    shared_call, unrolled = decoder.call_layer, flat_forward.forward_with_taps
    variants = (("once", shared_call), ("per layer", per_layer_call), ("scan", shared_call))
    rows = []
    print(f"{'layers traced':>14} {'programs':>8} {'lower s':>8} {'compile s':>9}", flush=True)
    for round_ in range(2):  # the first round pays jax and XLA one-time costs: the second is reported
        for name, call in variants:
            decoder.call_layer = call
            flat_forward.forward_with_taps = scanned_forward_with_taps if name == "scan" else unrolled
            jax.clear_caches()  # jit keeps traces by argument shapes, blind to the swapped loop body
            timed = time_programs(llm, args.programs, not args.no_compile, scan=name == "scan")
            if round_ == 1:
                rows.append(dict(variant=name, layers=llm.engine.runner.model_config.num_layers, **timed))
                compiled = "-" if timed["compile_s"] is None else f"{timed['compile_s']:.2f}"
                print(f"{name:>14} {timed['programs']:>8} {timed['lower_s']:>8.2f} {compiled:>9}", flush=True)
    decoder.call_layer, flat_forward.forward_with_taps = shared_call, unrolled
    print(f"lowering: per layer / once = {rows[1]['lower_s'] / rows[0]['lower_s']:.2f}x, "
          f"once / scan = {rows[0]['lower_s'] / rows[2]['lower_s']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(preset=args.preset, time=time.strftime("%Y%m%d-%H%M%S"), rows=rows),
                                   indent=2))


if __name__ == "__main__":
    main()
