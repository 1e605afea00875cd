"""Decode attention: paged kernel vs paged jnp reference vs dense (contiguous) attention.

For each (batch, context length) every sequence is full; the KV bytes a decode step
must read are the same for all three, so time and achieved bandwidth (KV bytes /
time) compare directly. Prints a table and writes JSON.

    PYTHONPATH=. python scripts/bench_attention.py            # on a GPU or TPU
    PYTHONPATH=. python scripts/bench_attention.py --small    # CPU smoke run

On CPU the kernel is skipped: it only runs there in interpret mode, which times
the interpreter, not the kernel.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import paged_attention, paged_attention_reference

METHODS = ("kernel", "reference", "dense")
SKIP_NOTE = "no accelerator: interpret mode would time the interpreter"


def dense_decode_attention(
    q: jax.Array,  # [batch, num_q_heads, head_dim]
    k: jax.Array,  # [batch, num_kv_heads, seq, head_dim] contiguous
    v: jax.Array,  # [batch, num_kv_heads, seq, head_dim] contiguous
    lengths: jax.Array,  # [batch] int32
) -> jax.Array:
    """Plain XLA GQA decode attention over a contiguous cache: [batch, num_q_heads, head_dim]."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads, seq = k.shape[1], k.shape[2]
    qg = q.reshape(batch, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    logits = jnp.einsum("bkgd,bksd->bkgs", qg, k, preferred_element_type=jnp.float32)
    logits = logits / math.sqrt(head_dim)
    mask = jnp.arange(seq)[None, :] < lengths[:, None]
    weights = jax.nn.softmax(jnp.where(mask[:, None, None], logits, -jnp.inf), axis=-1)
    out = jnp.einsum("bkgs,bksd->bkgd", weights.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.reshape(batch, num_q_heads, head_dim).astype(q.dtype)


def make_problem(key: jax.Array, batch: int, context: int, args: argparse.Namespace) -> dict:
    """Random q, a paged cache with shuffled pages, and the same KV laid out contiguously."""
    pages_per_seq = -(-context // args.page_size)
    num_pages = batch * pages_per_seq
    dtype = jnp.dtype(args.dtype)
    kq, kk, kv, kp = jax.random.split(key, 4)
    shape = (args.num_kv_heads, num_pages, args.page_size, args.head_dim)
    k_pages = jax.random.normal(kk, shape, dtype)
    v_pages = jax.random.normal(kv, shape, dtype)
    page_indices = jax.random.permutation(kp, num_pages).reshape(batch, pages_per_seq).astype(jnp.int32)

    def contiguous(pages: jax.Array) -> jax.Array:
        seq = pages[:, page_indices].reshape(args.num_kv_heads, batch, -1, args.head_dim)
        return seq.transpose(1, 0, 2, 3)

    return dict(
        q=jax.random.normal(kq, (batch, args.num_q_heads, args.head_dim), dtype),
        k_pages=k_pages, v_pages=v_pages, page_indices=page_indices,
        lengths=jnp.full((batch,), context, jnp.int32),
        k_dense=contiguous(k_pages), v_dense=contiguous(v_pages),
    )


def method_fn(method: str, p: dict) -> Callable[[], jax.Array]:
    """A zero-argument jitted call of one method on problem p."""
    paged = (p["q"], p["k_pages"], p["v_pages"], p["lengths"], p["page_indices"])
    if method == "kernel":
        fn = jax.jit(paged_attention)
        return lambda: fn(*paged)
    if method == "reference":
        return lambda: paged_attention_reference(*paged)
    fn = jax.jit(dense_decode_attention)
    return lambda: fn(p["q"], p["k_dense"], p["v_dense"], p["lengths"])


def median_seconds(fn: Callable[[], jax.Array], warmup: int, iters: int) -> float:
    """Median wall time of fn() after warm-up, each run waited with block_until_ready."""
    for _ in range(warmup):
        fn().block_until_ready()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn().block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_point(batch: int, context: int, args: argparse.Namespace, has_accelerator: bool) -> list[dict]:
    """Time every method at one (batch, context); returns one row per method."""
    problem = make_problem(jax.random.key(batch * 100_003 + context), batch, context, args)
    kv_bytes = 2 * batch * context * args.num_kv_heads * args.head_dim * jnp.dtype(args.dtype).itemsize
    expected = method_fn("dense", problem)()
    rows = []
    for method in METHODS:
        row = dict(batch=batch, context=context, method=method, kv_bytes=kv_bytes)
        if method == "kernel" and not has_accelerator:
            rows.append(row | dict(skipped=SKIP_NOTE))
            continue
        fn = method_fn(method, problem)
        error = float(jnp.max(jnp.abs(fn().astype(jnp.float32) - expected.astype(jnp.float32))))
        seconds = median_seconds(fn, args.warmup, args.iters)
        rows.append(row | dict(seconds=seconds, gbps=kv_bytes / seconds / 1e9, max_abs_err_vs_dense=error))
    dense = next(r["seconds"] for r in rows if r["method"] == "dense")
    for row in rows:
        if "seconds" in row:
            row["ratio_vs_dense"] = row["seconds"] / dense
    return rows


def print_table(rows: list[dict]) -> None:
    """One line per (batch, context, method)."""
    print(f"{'batch':>6} {'context':>8} {'method':>10} {'ms':>10} {'GB/s':>9} {'x dense':>8}  note")
    for r in rows:
        lead = f"{r['batch']:>6} {r['context']:>8} {r['method']:>10}"
        if "seconds" in r:
            print(
                f"{lead} {r['seconds'] * 1e3:>10.3f} {r['gbps']:>9.1f} {r['ratio_vs_dense']:>8.2f}"
                f"  err {r['max_abs_err_vs_dense']:.2e}"
            )
        else:
            print(f"{lead} {'-':>10} {'-':>9} {'-':>8}  {r['skipped']}")


def _int_list(text: str) -> list[int]:
    """'1,8,32' -> [1, 8, 32]."""
    return [int(x) for x in text.split(",")]


def parse_args() -> argparse.Namespace:
    """Command line; --small shrinks everything for a CPU smoke run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=_int_list, default=[1, 8, 32, 64])
    parser.add_argument("--context-lengths", type=_int_list, default=[1024, 4096, 16384])
    parser.add_argument("--max-tokens", type=int, default=1 << 20, help="skip batch*context above this")
    parser.add_argument("--num-q-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="tiny shapes for a CPU smoke run")
    parser.add_argument("--out", type=Path, default=Path("results/bench_attention.json"))
    args = parser.parse_args()
    if args.small:
        args.batch_sizes, args.context_lengths = [1, 4], [128, 512]
        args.num_q_heads, args.num_kv_heads, args.head_dim = 8, 2, 64
        args.warmup, args.iters = 1, 5
    return args


def main() -> None:
    """Run the sweep, print the table, write the JSON."""
    args = parse_args()
    backend = jax.default_backend()
    has_accelerator = backend in ("gpu", "tpu")
    rows = []
    for batch in args.batch_sizes:
        for context in args.context_lengths:
            if batch * context <= args.max_tokens:
                rows.extend(bench_point(batch, context, args, has_accelerator))
    print(f"device: {jax.devices()[0].device_kind} ({backend}), jax {jax.__version__}, dtype {args.dtype}")
    print_table(rows)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report = dict(
        device=jax.devices()[0].device_kind, backend=backend, jax_version=jax.__version__,
        numpy_version=np.__version__, config=config, results=rows,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
