"""Mamba-1's selective scan in a prefill step: the per-token scan (`mamba1_mixer.packed_scan`) against the chunked
form (`models/selective_chunks`: an associative scan within chunks of Q tokens, a scan across them), compile time
and run time, one mixer layer's recurrence at Mamba-1.4B's shape with random inputs (hidden 2048, expand 2: 4096
channels of 16 state entries; FalconMamba-7B and Jamba have 8192: `--inner 8192`).

The step's tokens are `--requests` prefill chunks continuing from their slots' states (positions from 1024 on) in a
pool of 8 slots, as bench_ssd.py's. Both forms get the same inputs and must agree (`max diff`: of y, relative to its
largest; of the slot states likewise). `Q` is the chunk, `*` marking the mixer's (`chunk_tokens`: [Q, I, N] float32
within 16 MiB). `state of copy` is the scan's state traffic (the [I, N] state read and written per token) over its
run time, against the measured copy bandwidth: past 100% the state stays in cache.

    PYTHONPATH=.:scripts python scripts/bench_selective.py                     # T = 512 to 8192, Q = 16, 64, 256
    PYTHONPATH=.:scripts python scripts/bench_selective.py --tokens 512 --chunks 8 32 --inner 8192 --requests 4
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
from bench_ssd import timed

from jaxinfer.cache.state_pool import LayerState
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.mamba1_mixer import packed_scan
from jaxinfer.models.selective_chunks import chunk_tokens, chunked_selective_scan
from jaxinfer.models.ssd_chunks import segments

SLOTS = 8


def state_space(inner: int, state_size: int) -> StateSpace:
    """A Mamba-1 mixer of `inner` channels, each with `state_size` state entries."""
    return StateSpace.selective((0,), inner=inner, state_size=state_size, kernel=4, rank=inner // 32,
                                conv_bias=True, proj_bias=False)


def step_inputs(ss: StateSpace, tokens: int, requests: int) -> tuple:
    """(A [I, N], pools with the token slots, x and dt [T, I], B and C [T, N], positions [T]) of a prefill step."""
    rng = np.random.RandomState(0)

    def normal(*shape: int, scale: float = 1.0) -> jax.Array:
        return jnp.asarray(rng.randn(*shape).astype(np.float32) * scale)

    I, N = ss.inner, ss.state_size
    share = -(-tokens // requests)
    slots = np.minimum(np.arange(tokens) // share, SLOTS - 1).astype(np.int32)
    positions = jnp.asarray((1024 + np.arange(tokens) % share).astype(np.int32))
    state = LayerState(normal(SLOTS, 3, I), normal(SLOTS, I, 1, N, scale=0.1), jnp.asarray(slots))
    a = -jnp.exp(normal(I, N, scale=0.5))
    return a, state, normal(tokens, I), jax.nn.softplus(normal(tokens, I) - 2.0), normal(tokens, N), \
        normal(tokens, N), positions


def compiled(fn, args: tuple) -> tuple:
    """(fn jitted and compiled for args, seconds to lower and compile it)."""
    start = time.perf_counter()
    executable = jax.jit(fn).lower(*args).compile()
    return executable, time.perf_counter() - start


def scan_program(ss: StateSpace):
    """The token scan over (a, state, x, dt, b, c, positions) -> (pool, y)."""
    return lambda a, state, x, dt, b, c, positions: packed_scan(ss, a, state, x, dt, b, c, positions, None)


def chunked_program(chunk: int):
    """The chunked form in chunks of `chunk` over the same arguments -> (pool, y)."""

    def run(a, state, x, dt, b, c, positions):
        seg = segments(state.token_slots, positions, min(SLOTS, positions.shape[0]))
        return chunked_selective_scan(x, dt, b, c, a, state.ssm, state.token_slots, positions, seg, chunk)

    return run


def bench(ss: StateSpace, tokens: int, chunks: list[int], args: argparse.Namespace) -> list[dict]:
    """Rows at `tokens` tokens: the scan, then the chunked form at each chunk."""
    inputs = step_inputs(ss, tokens, args.requests)
    scan, compile_s = compiled(scan_program(ss), inputs)
    expected_pool, expected_y = scan(*inputs)
    scan_s = timed(scan, inputs, args.repeats)
    state_bytes = tokens * 2 * 4 * ss.inner * ss.state_size
    rows = [dict(tokens=tokens, form="scan", chunk=None, auto=False, compile_s=compile_s, run_s=scan_s,
                 state_of_copy=state_bytes / scan_s / args.copy_bw, speedup=1.0, max_diff_y=0.0, max_diff_state=0.0)]
    for chunk in chunks:
        program, compile_s = compiled(chunked_program(chunk), inputs)
        pool, y = program(*inputs)
        run_s = timed(program, inputs, args.repeats)
        rows.append(dict(
            tokens=tokens, form="chunked", chunk=chunk, auto=chunk == chunk_tokens(ss), compile_s=compile_s,
            run_s=run_s, speedup=scan_s / run_s,
            max_diff_y=float(jnp.max(jnp.abs(y - expected_y)) / jnp.max(jnp.abs(expected_y))),
            max_diff_state=float(jnp.max(jnp.abs(pool - expected_pool)) / jnp.max(jnp.abs(expected_pool)))))
    return rows


def print_rows(rows: list[dict]) -> None:
    """The report as a fixed-width table."""
    print(f"{'T':>5} {'form':>8} {'Q':>5} {'compile s':>9} {'run ms':>9} {'ktok/s':>8} {'state of copy':>13} "
          f"{'speedup':>7} {'diff y':>8} {'diff state':>10}")
    for r in rows:
        chunk = "" if r["chunk"] is None else f"{r['chunk']}{'*' if r['auto'] else ''}"
        share = f"{r['state_of_copy']:>13.1%}" if r["form"] == "scan" else f"{'':>13}"
        print(f"{r['tokens']:>5} {r['form']:>8} {chunk:>5} {r['compile_s']:>9.2f} {r['run_s'] * 1e3:>9.1f} "
              f"{r['tokens'] / r['run_s'] / 1e3:>8.1f} {share} {r['speedup']:>7.2f} {r['max_diff_y']:>8.1e} "
              f"{r['max_diff_state']:>10.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--chunks", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--inner", type=int, default=4096)
    parser.add_argument("--state-size", type=int, default=16)
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/bench_selective.json"))
    args = parser.parse_args()
    ss = state_space(args.inner, args.state_size)
    args.copy_bw = measure_copy_bandwidth()
    print(f"{jax.default_backend()}: copy {args.copy_bw / 1e9:.1f} GB/s; I {ss.inner}, N {ss.state_size}, "
          f"the mixer's chunk {chunk_tokens(ss)}")
    rows = [row for t in args.tokens for row in bench(ss, t, args.chunks, args)]
    print_rows(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = dict(machine=platform.processor() or platform.machine(), backend=jax.default_backend(),
                  devices=[d.device_kind for d in jax.devices()], copy_bandwidth=args.copy_bw, inner=ss.inner,
                  state_size=ss.state_size, requests=args.requests, rows=rows)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
