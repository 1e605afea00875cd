"""Decode throughput: jaxinfer vs HF transformers `generate` on the same random-weight checkpoint.

Prints tokens/s for both, their ratio, and the fraction of the memory-bandwidth roofline
(weight bytes read per decode step x steps/s over the read bandwidth measured here). Writes JSON.

    python scripts/bench_decode.py                      # SmolLM-135M shape, CPU
    python scripts/bench_decode.py --preset llama-3.2-1b --dtypes bfloat16   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from jaxinfer import LLM, SamplingParams
from jaxinfer.weights import tree_bytes

PRESETS = {name: Path(__file__).parents[1] / "configs" / f"{name}.json" for name in ("smollm-135m", "llama-3.2-1b")}
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make_checkpoint(preset: str, root: Path) -> Path:
    """Save a random-weight Llama of the preset's shape as an HF checkpoint (reused if present)."""
    path = root / preset
    if (path / "config.json").is_file():
        return path
    torch.manual_seed(0)
    fields = json.loads(PRESETS[preset].read_text())
    fields.pop("architectures")
    config = transformers.LlamaConfig(**fields, bos_token_id=1, eos_token_id=2)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


def measure_read_bandwidth(n_bytes: int = 1 << 30) -> float:
    """Bytes/s the default device reads, from a jitted reduction over a large float32 array."""
    x = jnp.ones((n_bytes // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        total(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return n_bytes / min(times)


def median_time(fn, repeats: int) -> float:
    """Median wall time of fn() after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_jaxinfer(path: Path, dtype: str, prompts: list[list[int]], new_tokens: int, repeats: int) -> tuple[float, int]:
    """(seconds per generate call, weight bytes) for jaxinfer."""
    llm = LLM(path, dtype=dtype, max_seq_len=len(prompts[0]) + new_tokens)
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)

    def run() -> None:
        outs = llm.generate(prompts, params)
        assert all(len(o.token_ids) == new_tokens for o in outs)

    return median_time(run, repeats), tree_bytes(llm.weights)


def bench_hf(path: Path, dtype: str, prompts: list[list[int]], new_tokens: int, repeats: int) -> float:
    """Seconds per `generate` call for HF transformers (greedy, KV cache on)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=TORCH_DTYPES[dtype])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device).eval()
    ids = torch.tensor(prompts, device=device)

    def run() -> None:
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
            )
        if device == "cuda":
            torch.cuda.synchronize()
        assert out.shape[1] == ids.shape[1] + new_tokens

    return median_time(run, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm-135m", choices=sorted(PRESETS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "jaxinfer_bench")
    parser.add_argument("--out", type=Path, default=Path("results/bench_decode.json"))
    args = parser.parse_args()

    path = make_checkpoint(args.preset, args.model_dir)
    bandwidth = measure_read_bandwidth()
    print(f"device {jax.devices()[0].device_kind}; measured read bandwidth {bandwidth / 1e9:.1f} GB/s")
    rng = np.random.RandomState(0)
    rows = []
    for batch in args.batches:
        prompts = rng.randint(3, 32000, (batch, args.prompt_len)).tolist()
        for dtype in args.dtypes:
            ours, weight_bytes = bench_jaxinfer(path, dtype, prompts, args.new_tokens, args.repeats)
            theirs = bench_hf(path, dtype, prompts, args.new_tokens, args.repeats)
            tokens = batch * args.new_tokens
            roofline = weight_bytes * (args.new_tokens / ours) / bandwidth
            rows.append(dict(batch=batch, dtype=dtype, jaxinfer_tok_s=tokens / ours, hf_tok_s=tokens / theirs,
                             ratio=theirs / ours, roofline_fraction=roofline))
            print_row(rows[-1])
    summary = best_dtype_ratios(rows)
    print("jaxinfer best dtype vs HF best dtype:", {b: round(r, 2) for b, r in summary.items()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(
        preset=args.preset, device=jax.devices()[0].device_kind, read_bandwidth_gb_s=bandwidth / 1e9,
        prompt_len=args.prompt_len, new_tokens=args.new_tokens, rows=rows, best_ratio_by_batch=summary,
    ), indent=2))
    print(f"wrote {args.out}")


def print_row(row: dict) -> None:
    """One table line (the header is printed with the first row)."""
    if not getattr(print_row, "header_done", False):
        print(f"{'batch':>5} {'dtype':>9} {'jaxinfer tok/s':>15} {'HF tok/s':>10} {'ratio':>6} {'roofline':>9}")
        print_row.header_done = True
    print(f"{row['batch']:>5} {row['dtype']:>9} {row['jaxinfer_tok_s']:>15.1f} {row['hf_tok_s']:>10.1f} "
          f"{row['ratio']:>6.2f} {row['roofline_fraction']:>9.1%}")


def best_dtype_ratios(rows: list[dict]) -> dict[int, float]:
    """Per batch size: jaxinfer's best tokens/s over HF's best tokens/s across dtypes."""
    out = {}
    for batch in sorted({r["batch"] for r in rows}):
        sel = [r for r in rows if r["batch"] == batch]
        out[batch] = max(r["jaxinfer_tok_s"] for r in sel) / max(r["hf_tok_s"] for r in sel)
    return out


if __name__ == "__main__":
    main()
