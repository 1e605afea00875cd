"""MoE experts: the grouped implementations (each routed row through its own expert) against a dense
reference that runs every expert on every token and masks by the routing weights, for float and
quantized experts.

For each token count the routing is the same random top-k for all; FLOPs are the matmul
multiply-adds x 2: useful (rows x k x 3 D F, what any exact method must do), executed by the
tile loop (its tiles round each expert's rows up), and dense (tokens x E x 3 D F). Each
implementation of `grouped_matmul.expert_mlp` is timed per weight format (`--formats`: the
model dtype, int8, int4, fp8 experts as `quantization=` stores them): `ragged_dot` (the
accelerators' default), `gathered` (each row's expert weights gathered: reads only the experts
reached) and on CPU `tiled` (its default; jax 0.10 lowers `ragged_dot` on CPU to a masked product
with every expert). `min MB` is what any exact method must read (the experts the rows reach, as
stored) and `of copy` that over the copy bandwidth measured in the same run, for the fastest
implementation. On CPU 16-bit float experts are widened to float32 first, as the model holds them.

    PYTHONPATH=. python scripts/bench_moe.py                  # Mixtral-like shape scaled down
    PYTHONPATH=. python scripts/bench_moe.py --experts 32 --top-k 4 --hidden 2880 --intermediate 2880 \
        --tokens 1 8 64 512 --formats bfloat16 int8 int4    # gpt-oss-20b's experts, on a GPU
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from bench_decode import measure_copy_bandwidth

from jaxinfer.kernels.precision import matmul_precision
from jaxinfer.models.grouped_matmul import tile_rows
from jaxinfer.models.mlp import gate_product
from jaxinfer.models.moe import route, routed_experts
from jaxinfer.quantization.quantized_experts import EXPERT_MODES, QuantizedExperts, dequantize_experts, quantize_experts
from jaxinfer.quantization.quantized_weight import DEFAULT_GROUP

FLOAT_FORMATS = ("bfloat16", "float32")


def dense_experts(x: jax.Array, weights: jax.Array, experts: jax.Array, gate: jax.Array, up: jax.Array,
                  down: jax.Array) -> jax.Array:
    """Every expert on every token [E, T, D], mixed by the routing weights (0 for experts not chosen)."""
    num_experts = gate.shape[0]
    mix = jnp.zeros((x.shape[0], num_experts), jnp.float32).at[jnp.arange(x.shape[0])[:, None], experts].set(weights)
    precision = matmul_precision(x, gate)
    g = jnp.einsum("td,edf->etf", x, gate, precision=precision, preferred_element_type=jnp.float32).astype(x.dtype)
    u = jnp.einsum("td,edf->etf", x, up, precision=precision, preferred_element_type=jnp.float32).astype(x.dtype)
    y = jnp.einsum("etf,efd->etd", gate_product("silu", g, u), down, precision=precision,
                   preferred_element_type=jnp.float32)
    return jnp.einsum("etd,te->td", y, mix)


def timed(fn: Callable, args: tuple, repeats: int) -> float:
    """Median milliseconds of fn(*args) (compiled first)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def executed_rows(experts: np.ndarray, num_experts: int, tile: int) -> int:
    """Rows the tile loop multiplies: each expert's rows rounded up to whole tiles."""
    sizes = np.bincount(experts.reshape(-1), minlength=num_experts)
    return int(np.sum(-(-sizes // tile) * tile))


def expert_stacks(gate: jax.Array, up: jax.Array, down: jax.Array, fmt: str) -> tuple:
    """The three expert stacks in format `fmt` (a float dtype name as they are, else quantized to it)."""
    if fmt in FLOAT_FORMATS:
        return gate, up, down
    return tuple(quantize_experts(w, fmt, DEFAULT_GROUP) for w in (gate, up, down))


def reached_bytes(stacks: tuple, experts: np.ndarray) -> int:
    """Bytes of the experts the rows reach, as stored (values and scales): what any exact method reads."""
    share = len(np.unique(experts)) / stacks[0].shape[0]
    return int(share * sum(leaf.nbytes for leaf in jax.tree.leaves(stacks)))


def bench(tokens: int, args: argparse.Namespace, dtype: jnp.dtype, key: jax.Array, copy_bw: float) -> list[dict]:
    """Rows of the report at `tokens` tokens: one per weight format, each implementation timed."""
    E, D, F, k = args.experts, args.hidden, args.intermediate, args.top_k
    keys = jax.random.split(key, 5)
    x = jax.random.normal(keys[0], (tokens, D), dtype)
    router = jax.random.normal(keys[1], (D, E), dtype)
    scale = D**-0.5
    gate, up = (jax.random.normal(kk, (E, D, F), dtype) * scale for kk in keys[2:4])
    down = jax.random.normal(keys[4], (E, F, D), dtype) * F**-0.5
    weights, experts = jax.jit(route, static_argnums=(2, 3))(x, router, k, True)
    per_row = 3 * 2 * D * F
    on_cpu = jax.default_backend() == "cpu"
    implementations = ["tiled", "ragged_dot"] if on_cpu else ["ragged_dot"]
    if tokens * k <= args.gathered_max_rows:  # it holds each routed row's expert weights: decode-sized batches only
        implementations.append("gathered")
    rows = []
    for fmt in args.formats:
        stacks = expert_stacks(gate, up, down, fmt)
        run_stacks = tuple(w.astype(jnp.float32) for w in stacks) if on_cpu and fmt in FLOAT_FORMATS else stacks
        reference = tuple(dequantize_experts(w, dtype) if isinstance(w, QuantizedExperts) else w for w in stacks)
        row = dict(tokens=tokens, format=fmt, flops_useful=tokens * k * per_row, flops_dense=tokens * E * per_row,
                   min_bytes=reached_bytes(stacks, np.asarray(experts)))
        expected = jax.jit(dense_experts)(x, weights, experts, *reference)
        for name in implementations:
            run = jax.jit(functools.partial(routed_experts, first=0, act="silu", implementation=name))
            operands = (x, weights, experts, *run_stacks)
            row[f"{name}_max_abs_diff"] = float(jnp.max(jnp.abs(run(*operands) - expected)))
            row[f"{name}_ms"] = timed(run, operands, args.repeats)
        if fmt in FLOAT_FORMATS:
            row["dense_ms"] = timed(jax.jit(dense_experts), (x, weights, experts, *run_stacks), args.repeats)
        row["best"] = min(implementations, key=lambda name: row[f"{name}_ms"])
        row["of_copy"] = row["min_bytes"] / (row[f"{row['best']}_ms"] / 1e3) / copy_bw
        if on_cpu:
            tile = tile_rows(tokens * k, E)
            row.update(tile_rows=tile, flops_tiled_executed=executed_rows(np.asarray(experts), E, tile) * per_row)
        rows.append(row)
    return rows


def print_rows(rows: list[dict], implementations: list[str]) -> None:
    """The report as a fixed-width table (ms per implementation; min MB read; the best's share of copy bandwidth)."""
    names = implementations + ["dense"]
    print(f"{'tokens':>6} {'format':>9} " + " ".join(f"{n + ' ms':>13}" for n in names) +
          f" {'min MB':>8} {'best':>10} {'of copy':>7}")
    for r in rows:
        times = " ".join(f"{r[n + '_ms']:>13.3f}" if n + "_ms" in r else f"{'-':>13}" for n in names)
        print(f"{r['tokens']:>6} {r['format']:>9} {times} {r['min_bytes'] / 1e6:>8.1f} {r['best']:>10} "
              f"{r['of_copy']:>7.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=1792)
    parser.add_argument("--dtype", default="bfloat16", choices=list(FLOAT_FORMATS))
    parser.add_argument("--formats", nargs="+", default=None, choices=list(FLOAT_FORMATS) + list(EXPERT_MODES),
                        help="expert formats (default: the dtype, int8 and int4)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--gathered-max-rows", type=int, default=64,
                        help="time the gathered products up to this many routed rows (tokens x top-k)")
    parser.add_argument("--probe-mb", type=int, default=256, help="buffer size of the copy-bandwidth probe")
    parser.add_argument("--out", type=Path, default=Path("results/bench_moe.json"))
    args = parser.parse_args()
    args.formats = args.formats or [args.dtype, "int8", "int4"]
    dtype = jnp.dtype(args.dtype)
    copy_bw = measure_copy_bandwidth(args.probe_mb << 20)
    print(f"device {jax.devices()[0].device_kind}; copy bandwidth {copy_bw / 1e9:.1f} GB/s")
    rows = [row for t in args.tokens for row in bench(t, args, dtype, jax.random.key(t), copy_bw)]
    implementations = [n for n in ("tiled", "ragged_dot", "gathered") if any(f"{n}_ms" in r for r in rows)]
    print_rows(rows, implementations)
    report = dict(
        backend=jax.default_backend(), device=str(jax.devices()[0]), jax_version=jax.__version__,
        machine=platform.processor() or platform.machine(), copy_bandwidth_gb_s=copy_bw / 1e9,
        config=vars(args) | {"out": str(args.out)}, results=rows,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
