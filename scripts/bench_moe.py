"""MoE experts: the grouped matmul (each routed row through its own expert) against a dense
reference that runs every expert on every token and masks by the routing weights.

For each token count the routing is the same random top-k for both; FLOPs are the matmul
multiply-adds x 2: useful (rows x k x 3 D F, what any exact method must do), executed by the
grouped path (its tiles round each expert's rows up), and dense (tokens x E x 3 D F). On CPU the
grouped path is the tile loop and `ragged_dot` is timed too (jax 0.10 lowers it on CPU to a
masked product with every expert, dense in cost); elsewhere the grouped path is `ragged_dot`.
On CPU 16-bit experts are widened to float32 first, as the model holds them there.

    PYTHONPATH=. python scripts/bench_moe.py                  # Mixtral-like shape scaled down
    PYTHONPATH=. python scripts/bench_moe.py --experts 64 --top-k 8 --intermediate 512
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.kernels.precision import matmul_precision
from jaxinfer.models.grouped_matmul import tile_rows
from jaxinfer.models.mlp import gate_product
from jaxinfer.models.moe import route, routed_experts


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


def bench(tokens: int, args: argparse.Namespace, dtype: jnp.dtype, key: jax.Array) -> dict:
    """One row of the report: FLOPs and times of each method at `tokens` tokens."""
    E, D, F, k = args.experts, args.hidden, args.intermediate, args.top_k
    keys = jax.random.split(key, 5)
    x = jax.random.normal(keys[0], (tokens, D), dtype)
    router = jax.random.normal(keys[1], (D, E), dtype)
    scale = D**-0.5
    gate, up = (jax.random.normal(kk, (E, D, F), dtype) * scale for kk in keys[2:4])
    down = jax.random.normal(keys[4], (E, F, D), dtype) * F**-0.5
    if jax.default_backend() == "cpu":  # as the model runs them there (see weight_ops.widen_experts)
        gate, up, down = (w.astype(jnp.float32) for w in (gate, up, down))
    weights, experts = jax.jit(route, static_argnums=(2, 3))(x, router, k, True)
    operands = (x, weights, experts, gate, up, down)
    grouped = jax.jit(lambda *a: routed_experts(*a, first=0, act="silu"))
    dense = jax.jit(dense_experts)
    per_row = 3 * 2 * D * F
    row = dict(tokens=tokens, flops_useful=tokens * k * per_row, flops_dense=tokens * E * per_row)
    if jax.default_backend() == "cpu":
        tile = tile_rows(tokens * k, E)
        row.update(tile_rows=tile, flops_grouped_executed=executed_rows(np.asarray(experts), E, tile) * per_row)
    row["max_abs_diff"] = float(jnp.max(jnp.abs(grouped(*operands) - dense(*operands))))
    row["grouped_ms"] = timed(grouped, operands, args.repeats)
    row["dense_ms"] = timed(dense, operands, args.repeats)
    if jax.default_backend() == "cpu":
        ragged = jax.jit(lambda *a: routed_experts(*a, first=0, act="silu", implementation="ragged_dot"))
        row["ragged_dot_ms"] = timed(ragged, operands, args.repeats)
    row["dense_over_grouped"] = row["dense_ms"] / row["grouped_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=1792)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("results/bench_moe.json"))
    args = parser.parse_args()
    dtype = jnp.dtype(args.dtype)
    rows = [bench(t, args, dtype, jax.random.key(t)) for t in args.tokens]
    for r in rows:
        extra = f"  ragged_dot {r['ragged_dot_ms']:8.2f} ms" if "ragged_dot_ms" in r else ""
        print(f"tokens {r['tokens']:4d}: GFLOP useful {r['flops_useful'] / 1e9:7.3f} dense {r['flops_dense'] / 1e9:7.3f}"
              f"  grouped {r['grouped_ms']:8.2f} ms  dense {r['dense_ms']:8.2f} ms{extra}"
              f"  (dense / grouped {r['dense_over_grouped']:.2f}x)")
    report = dict(
        backend=jax.default_backend(), device=str(jax.devices()[0]), jax_version=jax.__version__,
        machine=platform.processor() or platform.machine(), config=vars(args) | {"out": str(args.out)}, results=rows,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
