"""Weight-only quantized matmul formulations on this device: which streams int8/int4 fastest?

On an H100 the model-level benchmark found int8 and int4 decode *slower* than bf16 (Llama-3.2-1B
shape, batch 1: int8 0.85x, int4 0.71x) although they stream 0.61x and 0.43x of the bytes, so
XLA's lowering of `quantized_matmul` does not reach the bandwidth a bf16 dot does. This script
times, on a chain of distinct square weights too large for the cache (each layer's output, rms
normalised, feeds the next), the library's path and alternative XLA formulations of the same
product, against a bf16 dot of the same shape, in one run:

- `library`: `quantization.quantized_matmul` as the model runs it;
- `scaled-operand`: int8 only, one dot against `values * scales` converted in the operand;
- `reduction`: the product written as a multiply and a sum over the input axis (XLA emits a
  reduction fusion that reads the int8 values where they lie, not a matmul);
- `pallas`: the Triton kernel of `pallas_kernels/quant_matmul_gpu.py` (interpret mode off the
  GPU), with its chosen tiling, and on a GPU a few other tilings (`pallas n64 s4`: 64 columns
  per program, K split 4 ways) to settle its defaults; `bf16 pallas` runs the same kernel over the
  bf16 weights (`bf16_matmul_gpu`), against XLA's `dot`.

Per row: ms per chain, bytes streamed per second (values + scales as stored), that over the copy
bandwidth measured in the same run, time relative to bf16, and the relative error of one layer's
product against float64. Writes JSON.

    PYTHONPATH=. python scripts/bench_quant_matmul.py            # on a GPU (a minute)
    PYTHONPATH=. python scripts/bench_quant_matmul.py --dims 2048 8192 --batches 1   # a 1B MLP's shapes
    PYTHONPATH=. python scripts/bench_quant_matmul.py --small    # CPU smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from bench_decode import measure_copy_bandwidth

from jaxinfer.quantization.quantized_weight import QuantizedWeight, dequantize, int4_rows, quantize, quantized_matmul
from pallas_kernels.quant_matmul_gpu import Tiling, bf16_matmul_gpu, int4_matmul_gpu, int8_matmul_gpu

Product = Callable[[jax.Array, QuantizedWeight | jax.Array], jax.Array]


def bf16_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.dot(x, w, preferred_element_type=jnp.float32)


def scaled_operand(x: jax.Array, q: QuantizedWeight) -> jax.Array:
    w = q.values.astype(jnp.bfloat16) * q.scales.astype(jnp.bfloat16)
    return jnp.dot(x, w, preferred_element_type=jnp.float32)


def reduction(x: jax.Array, q: QuantizedWeight) -> jax.Array:
    xf = x.astype(jnp.float32)
    if q.mode != "int4":
        return jnp.sum(xf[:, :, None] * q.values.astype(jnp.float32)[None], axis=1) * q.scales
    groups = q.scales.shape[0]
    w = int4_rows(q.values).astype(jnp.float32).reshape(groups, q.group, q.out_size)
    per_group = jnp.sum(xf.reshape(-1, groups, q.group, 1) * w[None], axis=2)  # [M, G, N]
    return jnp.sum(per_group * q.scales.astype(jnp.float32)[None], axis=1)


def pallas(tiling: Tiling | None) -> Product:
    """The Triton kernel with `tiling` (None: its own choice); interpret mode off the GPU."""
    interpret = jax.default_backend() != "gpu"

    def product(x: jax.Array, q: QuantizedWeight) -> jax.Array:
        if q.mode == "int4":
            return int4_matmul_gpu(x, q.values, q.scales, q.group, tiling, interpret)
        return int8_matmul_gpu(x, q.values, q.scales, tiling, interpret)

    return product


def bf16_pallas(tiling: Tiling | None) -> Product:
    interpret = jax.default_backend() != "gpu"
    return lambda x, w: bf16_matmul_gpu(x, w, tiling, interpret)


def pallas_variants(make: Callable[[Tiling | None], Product], block_k: int) -> dict[str, Product]:
    """The kernel's own tiling, and on a GPU a sweep of columns per program and K splits."""
    variants = {"pallas": make(None)}
    if jax.default_backend() == "gpu":
        for block_n in (64, 128):
            for splits in (1, 4, 16):
                variants[f"pallas n{block_n} s{splits}"] = make(Tiling(block_n, block_k, splits))
    return variants


def variants() -> dict[str, dict[str, Product]]:
    return {
        "bf16": {"dot": bf16_dot, **pallas_variants(bf16_pallas, 64)},
        "int8": {"library": quantized_matmul, "scaled-operand": scaled_operand, "reduction": reduction,
                 **pallas_variants(pallas, 128)},
        "int4": {"library": quantized_matmul, "reduction": reduction, **pallas_variants(pallas, 128)},
    }


def layer_weights(dims: list[int], layers: int, group: int) -> dict[str, list]:
    """Each format's chain: layer i maps dims[i % len] -> dims[(i + 1) % len] (one value: square)."""
    keys = jax.random.split(jax.random.key(0), layers)
    shapes = [(dims[i % len(dims)], dims[(i + 1) % len(dims)]) for i in range(layers)]
    dense = [(jax.random.normal(k, s) / s[0] ** 0.5).astype(jnp.bfloat16) for k, s in zip(keys, shapes)]
    return {
        "bf16": dense,
        "int8": [quantize(w, 1, "int8") for w in dense],
        "int4": [quantize(w, 1, "int4", group) for w in dense],
    }


def chain(product: Product) -> Callable:
    """jit(x, weights) -> x after every layer (rms-normalised so values stay in range)."""

    def run(x: jax.Array, weights: list) -> jax.Array:
        for w in weights:
            y = product(x, w)
            x = (y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + 1e-6)).astype(jnp.bfloat16)
        return x

    return jax.jit(run)


def stored_bytes(w: QuantizedWeight | jax.Array) -> int:
    return sum(leaf.nbytes for leaf in jax.tree.leaves(w))


def relative_error(product: Product, x: jax.Array, w: QuantizedWeight | jax.Array) -> float:
    """||product - float64 product|| / ||float64 product|| for one layer."""
    dense = np.asarray(w if not isinstance(w, QuantizedWeight) else dequantize(w), np.float64)
    ref = np.asarray(x, np.float64) @ dense
    got = np.asarray(jax.jit(product)(x, w), np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def compiled_runs(x: jax.Array, weights: dict[str, list], formats: list[str], batch: int) -> list[tuple]:
    """(format, variant, timed call, product) for each formulation that compiles here (run once)."""
    runs = []
    for fmt, products in variants().items():
        if fmt not in formats:
            continue
        for name, product in products.items():
            run = chain(product)
            call = functools.partial(lambda run, w: run(x, w).block_until_ready(), run, weights[fmt])
            try:
                call()
            except Exception as error:  # noqa: BLE001 - one failing formulation must not end the table
                print(f"{batch:>5} {fmt:>6} {name:>15}  failed: {repr(error)[:100]}")
                continue
            runs.append((fmt, name, call, product))
    return runs


def interleaved_medians(calls: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each call over `repeats` rounds that time every call once, in turn: a
    GPU's clocks or a neighbour's load then move all rows alike (timed one row after another,
    the first Pallas row of a format read up to 1.5x slower than the same kernel a row later)."""
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for i, call in enumerate(calls):
            start = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[4096],
                        help="layer sizes in turn (2048 8192: up then down projections); one value: square")
    parser.add_argument("--formats", nargs="+", default=["bf16", "int8", "int4"], choices=["bf16", "int8", "int4"])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--group", type=int, default=32, help="int4 group size")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="tiny shapes for a CPU smoke run")
    parser.add_argument("--out", type=Path, default=Path("results/bench_quant_matmul.json"))
    args = parser.parse_args()
    if args.small:
        args.dims, args.layers, args.repeats = [256], 4, 3
    copy_bw = measure_copy_bandwidth((64 if args.small else 2048) << 20)
    weights = layer_weights(args.dims, args.layers, args.group)
    device = jax.devices()[0].device_kind
    print(f"device {device}; copy bandwidth {copy_bw / 1e9:.0f} GB/s; {args.layers} layers cycling through "
          f"sizes {args.dims}")
    print(f"{'batch':>5} {'format':>6} {'variant':>15} {'ms':>8} {'GB/s':>7} {'of copy':>8} {'x bf16':>7} {'rel err':>8}")
    rows = []
    for batch in args.batches:
        x = jax.random.normal(jax.random.key(batch), (batch, args.dims[0])).astype(jnp.bfloat16)
        runs = compiled_runs(x, weights, args.formats, batch)
        seconds = interleaved_medians([run for _, _, run, _ in runs], args.repeats)
        base = seconds[0] if seconds else None  # the first row: bf16's XLA dot when timed
        for (fmt, name, _, product), t in zip(runs, seconds):
            streamed = sum(stored_bytes(w) for w in weights[fmt])
            err = relative_error(product, x, weights[fmt][0])
            row = dict(batch=batch, format=fmt, variant=name, ms=t * 1e3, gbps=streamed / t / 1e9,
                       of_copy=streamed / t / copy_bw, vs_bf16=t / base, rel_err=err)
            rows.append(row)
            print(f"{batch:>5} {fmt:>6} {name:>15} {row['ms']:>8.3f} {row['gbps']:>7.0f} {row['of_copy']:>8.1%} "
                  f"{row['vs_bf16']:>7.2f} {err:>8.1e}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(device=device, copy_bandwidth=copy_bw, dims=args.dims, layers=args.layers,
                                        rows=rows), indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
