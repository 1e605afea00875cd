"""Mamba2's recurrence in a prefill step: the per-token scan (`mamba2_mixer.packed_scan`) against the chunked SSD
(`packed_chunked`, models/ssd_chunks), compile time and run time, one mixer layer of a Llama-3.2-1B-like Mamba2
shape with random weights (hidden 2048, 64 heads of 64, state 128, one group, a 4-wide conv; a model has 16 such
layers).

The step's tokens are `--requests` prefill chunks continuing from their slots' states (positions from 1024 on)
in a pool of 8 slots, which bounds the segments the chunked form sizes its per-segment products by.
Both forms get the same inputs and must agree (`max diff`: of y, relative to its largest). `GFLOP` is each
form's arithmetic counted from its shapes (the scan's per-token state update and readout; the chunked form's
matmuls); `of limit` is the chunked form's FLOP/s over a square matmul's measured in the same run, and the
scan's streamed state (read and written each token) over the measured copy bandwidth: what bounds each.

    PYTHONPATH=.:scripts python scripts/bench_ssd.py                      # T = 512 and 2048, chunks of 256
    PYTHONPATH=.:scripts python scripts/bench_ssd.py --tokens 64 256 --chunks 64 256 --requests 4
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from bench_decode import measure_copy_bandwidth
from bench_throughput import matmul_flops

from jaxinfer.cache.state_pool import LayerState
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.mamba2_mixer import MixerWeights, packed_chunked, packed_scan

SLOTS = 8


def state_space(chunk: int) -> StateSpace:
    """A Llama-3.2-1B-like Mamba2 mixer (hidden 2048, expand 2) with chunks of `chunk`."""
    return StateSpace(layers=(0,), num_heads=64, head_dim=64, state_size=128, n_groups=1, conv_kernel=4,
                      chunk_size=chunk)


def step_inputs(ss: StateSpace, tokens: int, requests: int) -> tuple:
    """(pools and token slots, xbc [T, C], dt [T, H], positions [T], mixer weights) of a prefill step."""
    rng = np.random.RandomState(0)

    def normal(*shape: int, scale: float = 1.0) -> jax.Array:
        return jnp.asarray(rng.randn(*shape).astype(np.float32) * scale)

    C, H = ss.conv_dim, ss.num_heads
    share = -(-tokens // requests)
    slots = np.minimum(np.arange(tokens) // share, SLOTS - 1).astype(np.int32)
    positions = (1024 + np.arange(tokens) % share).astype(np.int32)
    weights = MixerWeights(in_proj=None, conv_weight=normal(C, 1, 4, scale=0.5), dt_bias=normal(H, scale=0.5),
                           a_log=normal(H, scale=0.5), d_skip=normal(H), gate_norm=None, out_proj=None,
                           conv_bias=normal(C, scale=0.1))
    state = LayerState(normal(SLOTS, 3, C), normal(SLOTS, H, ss.head_dim, ss.state_size, scale=0.1),
                       jnp.asarray(slots))
    return state, normal(tokens, C), normal(tokens, H), jnp.asarray(positions), weights


def scan_flops(ss: StateSpace, tokens: int) -> float:
    """The scan's arithmetic: per token the state's decay, the rank-1 update and the readout (2 each)."""
    return tokens * ss.num_heads * ss.head_dim * ss.state_size * 6.0


def chunked_flops(ss: StateSpace, tokens: int) -> float:
    """The chunked form's matmuls: C B^T and the masked product within chunks, the chunk-end and final states,
    the entering states' and slot states' readouts (multiply-adds x 2)."""
    Q, HPN = ss.chunk_size, ss.num_heads * ss.head_dim * ss.state_size
    padded = -(-tokens // Q) * Q
    within = padded * Q * (ss.n_groups * ss.state_size + ss.num_heads * ss.head_dim)
    segments = min(SLOTS, tokens)
    return 2.0 * (within + 2 * padded * HPN + 2 * segments * Q * HPN)


def timed(fn, args: tuple, repeats: int) -> float:
    """Best seconds of fn(*args), compiled, over `repeats` calls (the least disturbed on a shared machine)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times)


def compiled(run, ss: StateSpace, args: tuple) -> tuple:
    """(the compiled recurrence, seconds to lower and compile it)."""
    start = time.perf_counter()
    program = jax.jit(lambda state, xbc, dt, positions, w: run(ss, w, state, xbc, dt, positions))
    executable = program.lower(*args).compile()
    return executable, time.perf_counter() - start


def bench(tokens: int, chunk: int, args: argparse.Namespace, flops_limit: float, copy_bw: float) -> dict:
    """One row: both forms at `tokens` tokens, chunks of `chunk`."""
    ss = state_space(chunk)
    inputs = step_inputs(ss, tokens, args.requests)
    row = dict(tokens=tokens, chunk=chunk, requests=args.requests)
    outputs = {}
    for name, run in (("scan", packed_scan), ("chunked", packed_chunked)):
        executable, row[f"{name}_compile_s"] = compiled(run, ss, inputs)
        outputs[name] = executable(*inputs)
        row[f"{name}_run_s"] = timed(executable, inputs, args.repeats)
    y = outputs["scan"][1]
    row["max_diff_y"] = float(jnp.max(jnp.abs(y - outputs["chunked"][1])) / jnp.max(jnp.abs(y)))
    row["max_diff_state"] = float(jnp.max(jnp.abs(outputs["scan"][0].ssm - outputs["chunked"][0].ssm)))
    row["scan_gflop"] = scan_flops(ss, tokens) / 1e9
    row["chunked_gflop"] = chunked_flops(ss, tokens) / 1e9
    state_bytes = 4 * ss.num_heads * ss.head_dim * ss.state_size
    row["scan_of_copy"] = tokens * 2 * state_bytes / row["scan_run_s"] / copy_bw
    row["chunked_of_matmul"] = row["chunked_gflop"] * 1e9 / row["chunked_run_s"] / flops_limit
    row["speedup"] = row["scan_run_s"] / row["chunked_run_s"]
    return row


def print_rows(rows: list[dict]) -> None:
    """The report as a fixed-width table."""
    print(f"{'T':>5} {'Q':>4} {'form':>8} {'compile s':>9} {'run ms':>9} {'GFLOP':>7} {'of limit':>9} "
          f"{'speedup':>7} {'max diff':>9}")
    for r in rows:
        for name, limit in (("scan", "scan_of_copy"), ("chunked", "chunked_of_matmul")):
            speedup = f"{r['speedup']:>7.1f}" if name == "chunked" else f"{'':>7}"
            print(f"{r['tokens']:>5} {r['chunk']:>4} {name:>8} {r[name + '_compile_s']:>9.2f} "
                  f"{r[name + '_run_s'] * 1e3:>9.1f} {r[name + '_gflop']:>7.2f} {r[limit]:>9.1%} {speedup} "
                  f"{r['max_diff_y'] if name == 'chunked' else 0.0:>9.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--chunks", type=int, nargs="+", default=[256])
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/bench_ssd.json"))
    args = parser.parse_args()
    flops_limit, copy_bw = matmul_flops(jnp.float32), measure_copy_bandwidth()
    print(f"{jax.default_backend()}: float32 matmul {flops_limit / 1e9:.0f} GFLOP/s, copy {copy_bw / 1e9:.1f} GB/s")
    rows = [bench(t, q, args, flops_limit, copy_bw) for t in args.tokens for q in args.chunks]
    print_rows(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = dict(machine=platform.processor() or platform.machine(), backend=jax.default_backend(),
                  devices=[d.device_kind for d in jax.devices()], matmul_flops=flops_limit, copy_bandwidth=copy_bw,
                  rows=rows)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
