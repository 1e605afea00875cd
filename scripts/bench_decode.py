"""Decode throughput: jaxinfer vs HF transformers `generate` on the same random-weight checkpoint.

Prints tokens/s for both (whole `generate` calls) and their ratio, then jaxinfer's decode alone:
a step's time (a 1-token generate subtracted from an N-token one, so prefill is not in it), the
bytes a step streams (every layer weight, the output head once, the KV cache read at the mean
context; a tied embedding is read once, by the head, not by the token lookup) and that over
the device-copy bandwidth measured in the same run. A reduction-read probe is printed beside it
for comparison: on an H100 it reads ~2.0 TB/s where a copy moves ~3.0. Writes JSON.

    python scripts/bench_decode.py                      # SmolLM-135M shape, CPU
    python scripts/bench_decode.py --preset llama-3.2-1b --dtypes bfloat16   # on a GPU
    python scripts/bench_decode.py --preset llama-110m --tp 2 --fake-cpu-devices 8 --skip-hf  # sharded
    python scripts/bench_decode.py --preset gpt-oss-mini --dtypes float32   # GPT-OSS's layer at a CPU size

--tp/--dp shard the model over a device mesh. With --fake-cpu-devices the "devices" are
slices of one CPU: the figure is the overhead of the sharded program (collectives, smaller
matmuls), a check of the correctness path, not a speed-up; scaling needs real devices.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if "--fake-cpu-devices" in sys.argv:  # must be set before jax starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count="
                               + sys.argv[sys.argv.index("--fake-cpu-devices") + 1])

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from jaxinfer import LLM, SamplingParams
from jaxinfer.parallel.array_info import tree_bytes
from jaxinfer.quantization.quantized_weight import QuantizedWeight

PRESETS = {name: Path(__file__).parents[1] / "configs" / f"{name}.json"
           for name in ("smollm-135m", "llama-110m", "llama-3.2-1b", "gpt-oss-mini", "gpt-oss-20b-6layers",
                        "gpt-oss-20b", "deepseek-v2-lite-4layers", "glm-4.5-air-2layers")}
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make_checkpoint(preset: str, root: Path) -> Path:
    """Save a random-weight model of the preset's architecture and shape as an HF checkpoint (reused if present)."""
    path = root / preset
    if (path / "config.json").is_file():
        return path
    torch.manual_seed(0)
    fields = json.loads(PRESETS[preset].read_text())
    model_class = getattr(transformers, fields.pop("architectures")[0])
    stored = getattr(torch, fields.pop("torch_dtype", "float32"))  # large presets: bf16, as released
    config = model_class.config_class(**{"bos_token_id": 1, "eos_token_id": 2, **fields})
    model_class(config).to(stored).save_pretrained(path)
    return path


def _best_seconds(fn, x: jax.Array, repeats: int = 5) -> float:
    """Fastest of `repeats` timed calls after a compile call."""
    fn(x).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return min(times)


def measure_copy_bandwidth(n_bytes: int = 1 << 30, repeats: int = 5, passes: int = 8) -> float:
    """Bytes/s (read + written) of `passes` elementwise passes over a float32 buffer in one call.

    + 1 rather than + 0, which XLA may fold into no copy at all; the input is donated so each
    call streams into reused memory (a fresh output buffer costs page faults on CPU). Several
    passes per call (a fixed-count loop: no host round trip between them) keep the call's
    dispatch and sync out of the figure: timed one pass per call, an H100's ~3.0 TB/s read as
    1.9-2.7 TB/s.
    """
    step = jax.jit(lambda a: jax.lax.fori_loop(0, passes, lambda _, b: b + 1.0, a), donate_argnums=0)
    x = step(jnp.ones((n_bytes // 4,), jnp.float32)).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        x = step(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * n_bytes * passes / min(times)


def measure_read_bandwidth(n_bytes: int = 1 << 30) -> float:
    """Bytes/s a jitted reduction reads (a lower figure than a copy's on GPUs; shown for reference)."""
    return n_bytes / _best_seconds(jax.jit(jnp.sum), jnp.ones((n_bytes // 4,), jnp.float32))


def decode_step_bytes(llm: LLM, batch: int, context: int) -> int:
    """Bytes one decode step streams: layer weights (of routed experts, the share `batch` tokens reach),
    final norm, the head once, and the KV cache read."""
    weights = llm.weights
    head = weights.embed if weights.lm_head is None else weights.lm_head  # a tied head reads embed
    if isinstance(llm._run_weights.lm_head, QuantizedWeight):  # quantize_lm_head: the quantized copy
        head = llm._run_weights.lm_head
    cfg = llm.config
    kv_itemsize = jnp.dtype(llm.dtype).itemsize
    kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * kv_itemsize * context * batch
    layers = sum(layer_bytes(lw, cfg, batch) for lw in weights.layers)
    return int(layers) + tree_bytes(weights.final_norm) + tree_bytes(head) + kv


def layer_bytes(lw, cfg, batch: int) -> float:
    """One layer's bytes a step reads: its routed experts' leaves (any [E, ...] leaf of the layer's
    EXPERTS, and their biases) in the expected share of experts `batch` tokens of k uniform picks touch."""
    experts = set(getattr(type(lw), "EXPERTS", ()))
    expert_leaves = {name for name in vars(lw) if name in experts or name in ("gate_bias", "up_bias", "down_bias")}
    share = 1 - (1 - cfg.experts_per_token / cfg.num_experts) ** batch if experts else 1.0
    routed = sum(tree_bytes(getattr(lw, name)) for name in expert_leaves)
    return tree_bytes(lw) - routed + share * routed


def median_time(fn, repeats: int) -> float:
    """Median wall time of fn() after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_generate(llm: LLM, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    """Seconds: a whole generate, prefill (a 1-token generate) and one decode step (the difference)."""

    def run(tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)

        def call() -> None:
            outs = llm.generate(prompts, params)
            assert all(len(o.token_ids) == tokens for o in outs)

        return median_time(call, repeats)

    whole, prefill = run(new_tokens), run(1)
    return dict(generate_s=whole, prefill_s=prefill, step_s=max(whole - prefill, 0.0) / max(new_tokens - 1, 1))


def bench_jaxinfer(
    path: Path, dtype: str, prompts: list[list[int]], new_tokens: int, repeats: int, tp: int = 1, dp: int = 1,
) -> dict:
    """generate/prefill/step seconds and the bytes a decode step streams, for jaxinfer on a tp x dp mesh."""
    # No prefix cache: repeats of the same prompts would hit it, shortening (and recompiling) the prefill.
    llm = LLM(path, dtype=dtype, max_seq_len=len(prompts[0]) + new_tokens,
              tensor_parallel_size=tp, data_parallel_size=dp, enable_prefix_caching=False)
    times = time_generate(llm, prompts, new_tokens, repeats)
    context = len(prompts[0]) + new_tokens // 2
    return dict(times, step_bytes=decode_step_bytes(llm, len(prompts), context))


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
    parser.add_argument("--probe-mb", type=int, default=1024, help="buffer size of the bandwidth probes")
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "jaxinfer_bench")
    parser.add_argument("--out", type=Path, default=Path("results/bench_decode.json"))
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel devices")
    parser.add_argument("--dp", type=int, default=1, help="data parallel device groups")
    parser.add_argument("--fake-cpu-devices", type=int, default=None, help="split the CPU into N jax devices")
    parser.add_argument("--skip-hf", action="store_true", help="time jaxinfer only (HF columns left empty)")
    args = parser.parse_args()

    path = make_checkpoint(args.preset, args.model_dir)
    copy_bw, read_bw = measure_copy_bandwidth(args.probe_mb << 20), measure_read_bandwidth(args.probe_mb << 20)
    print(f"device {jax.devices()[0].device_kind}; copy bandwidth {copy_bw / 1e9:.1f} GB/s "
          f"(reduction read {read_bw / 1e9:.1f} GB/s)")
    rng = np.random.RandomState(0)
    rows = []
    for batch in args.batches:
        prompts = rng.randint(3, 32000, (batch, args.prompt_len)).tolist()
        for dtype in args.dtypes:
            ours = bench_jaxinfer(path, dtype, prompts, args.new_tokens, args.repeats, args.tp, args.dp)
            theirs = float("nan") if args.skip_hf else bench_hf(path, dtype, prompts, args.new_tokens, args.repeats)
            rows.append(summarize(batch, dtype, args.new_tokens, ours, theirs, copy_bw))
            print_row(rows[-1])
    summary = best_dtype_ratios(rows)
    print("jaxinfer best dtype vs HF best dtype:", {b: round(r, 2) for b, r in summary.items()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(
        preset=args.preset, device=jax.devices()[0].device_kind, tp=args.tp, dp=args.dp,
        fake_cpu_devices=args.fake_cpu_devices, copy_bandwidth_gb_s=copy_bw / 1e9,
        read_bandwidth_gb_s=read_bw / 1e9, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
        rows=rows, best_ratio_by_batch=summary,
    ), indent=2))
    print(f"wrote {args.out}")


def summarize(batch: int, dtype: str, new_tokens: int, ours: dict, hf_seconds: float, copy_bw: float) -> dict:
    """One result row: end-to-end tokens/s for both, and jaxinfer's decode step against the copy bandwidth."""
    tokens = batch * new_tokens
    step_bw = ours["step_bytes"] / ours["step_s"] if ours["step_s"] > 0 else float("nan")
    return dict(
        batch=batch, dtype=dtype, jaxinfer_tok_s=tokens / ours["generate_s"], hf_tok_s=tokens / hf_seconds,
        ratio=hf_seconds / ours["generate_s"], prefill_ms=ours["prefill_s"] * 1e3, step_ms=ours["step_s"] * 1e3,
        decode_tok_s=batch / ours["step_s"] if ours["step_s"] > 0 else float("nan"),
        step_bytes=ours["step_bytes"], step_gb_s=step_bw / 1e9, copy_fraction=step_bw / copy_bw,
    )


def print_row(row: dict) -> None:
    """One table line (the header is printed with the first row)."""
    if not getattr(print_row, "header_done", False):
        print(f"{'batch':>5} {'dtype':>9} {'jaxinfer tok/s':>15} {'HF tok/s':>10} {'ratio':>6} "
              f"{'prefill ms':>10} {'step ms':>8} {'decode tok/s':>12} {'step GB/s':>9} {'of copy':>8}")
        print_row.header_done = True
    print(f"{row['batch']:>5} {row['dtype']:>9} {row['jaxinfer_tok_s']:>15.1f} {row['hf_tok_s']:>10.1f} "
          f"{row['ratio']:>6.2f} {row['prefill_ms']:>10.1f} {row['step_ms']:>8.2f} {row['decode_tok_s']:>12.1f} "
          f"{row['step_gb_s']:>9.1f} {row['copy_fraction']:>8.1%}")


def best_dtype_ratios(rows: list[dict]) -> dict[int, float]:
    """Per batch size: jaxinfer's best tokens/s over HF's best tokens/s across dtypes."""
    out = {}
    for batch in sorted({r["batch"] for r in rows}):
        sel = [r for r in rows if r["batch"] == batch]
        out[batch] = max(r["jaxinfer_tok_s"] for r in sel) / max(r["hf_tok_s"] for r in sel)
    return out


if __name__ == "__main__":
    main()
