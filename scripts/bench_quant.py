"""Decode tokens/s of bf16, int8, int4 and fp8 weights (same random-weight checkpoint, one run).

For each batch size and weight format: a decode step's time (a 1-token generate subtracted
from an N-token one), the bytes a step streams (quantized layers as stored: values + scales;
the head as it runs, bf16 unless the format ends in "+head" (`quantize_lm_head=True`); the KV
cache as it is), that over the copy bandwidth measured in the same run (the roofline fraction)
and over the read bandwidth (`of read`: a jitted sum over a buffer of the same size), the
speedup over bf16, and the speedup its bytes allow (`bound`: bf16's bytes per step over the
format's; with the head in bf16 it caps int8 at ~1.64x on both presets). Decode only reads
its bytes: on a 2-core VM a copy, counted as bytes read plus written, measured 52-88 GB/s
where reads alone reached 32, the rate the kernels stream at.
The formats are timed in turn within each round and the speedup is the median of the per-round
ratios, so load from other processes on a shared machine moves both sides of a ratio alike.
Writes a table and JSON.

    python scripts/bench_quant.py                      # SmolLM-135M shape, CPU: bf16 int8 int4 (+head)
    python scripts/bench_quant.py --preset llama-3.2-1b --formats bf16 int8 int4 fp8 int8-xla int4-xla  # on a GPU

On a GPU, int8 and int4 decode rows run the Triton kernel (`LLM(quantized_kernel=None)`); the
"-xla" formats turn it off, timing XLA's dot on the same weights in the same rounds. The
"-split" formats run q/k/v and gate/up as separate products instead of joined ones (what runs
on one device off the CPU kernels' path, see jaxinfer/models/joined_weight.py): the join's gain.

    python scripts/bench_quant.py --preset llama-3.2-1b --batches 1 8 --formats bf16 bf16-split int8 int8-split

fp8 (e4m3 values, per-column scales) is left out of the default formats on CPU, where no
matmul kernel reads it (it runs as XLA's dequantize-and-multiply); on accelerators it is in.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from bench_decode import PRESETS, decode_step_bytes, make_checkpoint, measure_copy_bandwidth, measure_read_bandwidth

from jaxinfer import LLM, SamplingParams
from jaxinfer.models import split_projections

# name: (quantization, quantize_lm_head, quantized_kernel); kernel None = the default (on for one GPU),
# False = XLA's dot ("-xla": on a GPU, the path the Triton kernel replaces).
FORMATS = {
    "bf16": (None, False, None), "int8": ("int8", False, None), "int4": ("int4", False, None),
    "fp8": ("fp8", False, None), "int8+head": ("int8", True, None), "int4+head": ("int4", True, None),
    "fp8+head": ("fp8", True, None), "int8-xla": ("int8", False, False), "int4-xla": ("int4", False, False),
    "bf16-split": (None, False, None), "int8-split": ("int8", False, None), "int4-split": ("int4", False, None),
}
CPU_FORMATS = ["bf16", "int8", "int4", "int8+head", "int4+head"]
SPLIT_SUFFIX = "-split"


def default_formats() -> list[str]:
    """Every format but the split ones on an accelerator; on CPU those its matmul kernels read (not fp8)."""
    return CPU_FORMATS if jax.default_backend() == "cpu" else [f for f in FORMATS if not f.endswith(SPLIT_SUFFIX)]


def load(path: Path, name: str, max_seq_len: int, decode_steps: int) -> LLM:
    """The checkpoint in bf16 with the format's weight (and head) quantization."""
    quantization, head, kernel = FORMATS[name]
    # No prefix cache: repeated prompts would hit it, shortening (and recompiling) the timed prefill.
    llm = LLM(path, dtype="bfloat16", max_seq_len=max_seq_len, quantization=quantization, quantize_lm_head=head,
              quantized_kernel=kernel, enable_prefix_caching=False, decode_steps=decode_steps)
    if name.endswith(SPLIT_SUFFIX):  # what runs, with its joined projections split (the engine holds it too)
        llm._run_weights = llm.engine.weights = split_projections(llm._run_weights)
    return llm


def step_seconds(llm: LLM, prompts: list[list[int]], new_tokens: int) -> float:
    """One decode step: an N-token generate less a 1-token one (the prefill), per further token."""

    def run(tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        elapsed = time.perf_counter() - start
        assert all(len(o.token_ids) == tokens for o in outs)
        return elapsed

    return max(run(new_tokens) - run(1), 0.0) / max(new_tokens - 1, 1)


def bench_batch(path: Path, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, dict]:
    """Per format: median step seconds over rounds visiting every format, bytes per step, ratio to bf16."""
    max_seq_len = args.prompt_len + args.new_tokens
    llms = {}
    for name in args.formats:
        try:  # a format that fails (a kernel that does not compile here) leaves the others timed
            llms[name] = load(path, name, max_seq_len, args.decode_steps)
            step_seconds(llms[name], prompts, args.new_tokens)  # compiles every shape the rounds use
        except Exception as error:  # noqa: BLE001 - reported, and the run goes on
            print(f"{name}: failed, left out: {type(error).__name__}: {error}"[:2000], flush=True)
            llms.pop(name, None)
    rounds: dict[str, list[float]] = {name: [] for name in llms}
    for _ in range(args.repeats):
        for name, llm in llms.items():
            rounds[name].append(step_seconds(llm, prompts, args.new_tokens))
    context = args.prompt_len + args.new_tokens // 2
    results = {}
    for name, llm in llms.items():
        ratios = [b / s for b, s in zip(rounds["bf16"], rounds[name])] if "bf16" in rounds else None
        step_s = statistics.median(rounds[name])
        results[name] = dict(step_s=step_s, step_bytes=decode_step_bytes(llm, len(prompts), context),
                             decode_tok_s=len(prompts) / step_s, vs_bf16=statistics.median(ratios) if ratios else None)
        llm.close()
    return results


def row(batch: int, name: str, result: dict, copy_bw: float, read_bw: float, bf16_bytes: float | None) -> dict:
    """One table row (vs_bf16: the median per-round speedup over bf16 at the same batch; None without bf16).

    bytes_bound: bf16's bytes per step over this format's, the speedup a step bound by its bytes
    alone would reach; fixed per-step work (kernel launches, small ops) keeps vs_bf16 below it.
    """
    gb_s = result["step_bytes"] / result["step_s"] / 1e9
    bound = bf16_bytes / result["step_bytes"] if bf16_bytes else None
    return dict(batch=batch, weights=name, decode_tok_s=result["decode_tok_s"], step_ms=result["step_s"] * 1e3,
                step_mb=result["step_bytes"] / 1e6, step_gb_s=gb_s, roofline=gb_s * 1e9 / copy_bw,
                of_read=gb_s * 1e9 / read_bw, vs_bf16=result["vs_bf16"], bytes_bound=bound)


def print_table(rows: list[dict]) -> None:
    """The results as a fixed-width table."""
    print(f"{'batch':>5} {'weights':>9} {'tok/s':>8} {'step ms':>8} {'MB/step':>8} {'GB/s':>6} {'roofline':>8} "
          f"{'of read':>7} {'vs bf16':>7} {'bound':>6}")
    for r in rows:
        print(f"{r['batch']:>5} {r['weights']:>9} {r['decode_tok_s']:>8.1f} {r['step_ms']:>8.2f} {r['step_mb']:>8.1f} "
              f"{r['step_gb_s']:>6.1f} {r['roofline']:>8.1%} {r['of_read']:>7.1%} {_ratio(r['vs_bf16']):>7} "
              f"{_ratio(r['bytes_bound']):>6}")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm-135m", choices=sorted(PRESETS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--formats", nargs="+", default=None, choices=list(FORMATS),
                        help="weight formats to time (default: bf16 int8 int4 (+head) on CPU, all elsewhere); "
                             "vs_bf16 needs bf16 among them")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--decode-steps", type=int, default=8, help="decode steps per engine call (LLM's decode_steps)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds over all formats (median taken)")
    parser.add_argument("--probe-mb", type=int, default=512, help="buffer size of the bandwidth probe")
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "jaxinfer_bench")
    parser.add_argument("--out", type=Path, default=Path("results/bench_quant.json"))
    args = parser.parse_args()
    args.formats = args.formats or default_formats()

    path = make_checkpoint(args.preset, args.model_dir)
    copy_bw = measure_copy_bandwidth(args.probe_mb << 20)
    read_bw = measure_read_bandwidth(args.probe_mb << 20)
    print(f"device {jax.devices()[0].device_kind}; copy bandwidth {copy_bw / 1e9:.1f} GB/s, read {read_bw / 1e9:.1f} GB/s")
    rng = np.random.RandomState(0)
    rows = []
    for batch in args.batches:
        prompts = rng.randint(3, 32000, (batch, args.prompt_len)).tolist()
        results = bench_batch(path, prompts, args)
        bf16_bytes = results["bf16"]["step_bytes"] if "bf16" in results else None
        rows += [row(batch, name, result, copy_bw, read_bw, bf16_bytes) for name, result in results.items()]
        print_table(rows[-len(results):])
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(
        preset=args.preset, device=jax.devices()[0].device_kind, copy_bandwidth_gb_s=copy_bw / 1e9,
        read_bandwidth_gb_s=read_bw / 1e9,
        prompt_len=args.prompt_len, new_tokens=args.new_tokens, decode_steps=args.decode_steps, repeats=args.repeats,
        rows=rows,
    ), indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
