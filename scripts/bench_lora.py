"""What serving LoRA adapters costs: the engine with adapter slots against the engine without, one run.

Three engine runs of one workload (B greedy requests, 64-token prompts, N output tokens,
ignore_eos) on the same weights: no adapter slots (the baseline), `enable_lora=True` serving
base-model rows only (the slots' cost when idle), and every row through one of `--adapters`
random all-projection adapters of rank `--rank`, mixed in each batch. Each figure is the median
of `--repeats` timed generate calls after an untimed one. Also HF peft's `generate` of one
adapter on the same batch (`--skip-hf` to leave it out), and the batch-1 step's share of the
copy bandwidth measured here: (weights + the slots' factors) read per step over the step time.
Writes JSON under results/.

    python scripts/bench_lora.py                                  # demo target, batch 1 and 16
    python scripts/bench_lora.py --model smollm-135m --batch 1 8 --skip-hf
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_decode import make_checkpoint, measure_copy_bandwidth
from safetensors.numpy import save_file

from jaxinfer import LLM, LoRARequest, SamplingParams, load_config
from jaxinfer.checkpoint.lora_adapter import PREFIX, module_parts
from jaxinfer.entrypoints.llm import DEMO_MODEL
from jaxinfer.models.lora_weight import adapter_factors
from jaxinfer.parallel.array_info import tree_bytes

RESULTS = Path(__file__).parents[1] / "results"


def write_adapter(model: Path, out: Path, rank: int, seed: int) -> Path:
    """A random adapter of every projection in PEFT's layout (small factors: the text stays plausible)."""
    cfg, rng = load_config(model), np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": rank}))
    tensors = {}
    for module, parts in module_parts(cfg).items():
        rows = max(p.row_offset + p.rows for p in parts)
        tensors[f"{PREFIX}{module}.lora_A.weight"] = rng.normal(0, 0.02, (rank, parts[0].in_size)).astype(np.float32)
        tensors[f"{PREFIX}{module}.lora_B.weight"] = rng.normal(0, 0.02, (rows, rank)).astype(np.float32)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    return out


def timed_generate(llm: LLM, prompts: list, params: SamplingParams, adapters: list, repeats: int) -> float:
    """Median seconds of a generate call (after one untimed: compiles, slot loads)."""
    llm.generate(prompts, params, lora_request=adapters)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate(prompts, params, lora_request=adapters)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def hf_peft_seconds(model: Path, adapter: Path, prompts: list, tokens: int, dtype: str) -> float | None:
    """HF peft generate with one adapter on the same batch (None without peft)."""
    try:
        import peft
        import torch
        import transformers
    except ImportError:
        return None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype))
    served = peft.PeftModel.from_pretrained(base, adapter).eval().to(device)
    ids = torch.tensor(prompts, device=device)
    run = lambda: served.generate(input_ids=ids, max_new_tokens=tokens, min_new_tokens=tokens,  # noqa: E731
                                  do_sample=False, pad_token_id=0)
    with torch.no_grad():
        run()
        start = time.perf_counter()
        run()
    return time.perf_counter() - start


def bench_batch(llms: dict, paths: list[Path], model: Path, batch: int, args) -> dict:
    rng = np.random.default_rng(batch)
    vocab = llms["plain"].config.vocab_size
    prompts = [rng.integers(3, vocab, 64).tolist() for _ in range(batch)]
    params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    requests = [LoRARequest(f"adapter-{i}", i + 1, str(p)) for i, p in enumerate(paths)]
    mixed = [requests[i % len(requests)] for i in range(batch)]
    runs = {
        "no_slots": timed_generate(llms["plain"], prompts, params, None, args.repeats),
        "slots_idle": timed_generate(llms["lora"], prompts, params, None, args.repeats),
        "adapted": timed_generate(llms["lora"], prompts, params, mixed, args.repeats),
    }
    row = {name: dict(seconds=s, tokens_per_s=batch * args.tokens / s) for name, s in runs.items()}
    for name in ("slots_idle", "adapted"):
        row[name]["vs_no_slots"] = runs["no_slots"] / runs[name]
    if not args.skip_hf and (hf := hf_peft_seconds(model, paths[0], prompts, args.tokens, args.dtype)) is not None:
        row["hf_peft"] = dict(seconds=hf, tokens_per_s=batch * args.tokens / hf)
        row["adapted"]["vs_hf_peft"] = hf / runs["adapted"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo", help="demo, or a configs/ preset (random weights)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--adapters", type=int, default=2, help="adapters mixed in a batch (= max_loras)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--checkpoints", type=Path, default=Path("/tmp/jaxinfer-bench"))
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (default: results/bench_lora_*.json)")
    args = parser.parse_args()
    model = DEMO_MODEL if args.model == "demo" else make_checkpoint(args.model, args.checkpoints)
    root = Path(tempfile.mkdtemp())
    paths = [write_adapter(model, root / f"adapter-{i}", args.rank, i) for i in range(args.adapters)]
    knobs = dict(dtype=args.dtype, max_seq_len=64 + args.tokens + 16, max_num_seqs=max(args.batch))
    llms = {"plain": LLM(model, **knobs),
            "lora": LLM(model, enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank, **knobs)}
    bandwidth = measure_copy_bandwidth()
    weight_bytes = tree_bytes(llms["plain"].weights)
    slot_bytes = sum(f.nbytes for f in adapter_factors(llms["lora"].engine.runner.weights))
    rows = {batch: bench_batch(llms, paths, model, batch, args) for batch in args.batch}
    print(f"{args.model} {args.dtype}, {args.adapters} adapters of rank {args.rank} "
          f"(slots {slot_bytes / 1e6:.1f} MB beside {weight_bytes / 1e6:.1f} MB of weights), "
          f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    print(f"{'batch':>5} {'no slots tok/s':>15} {'idle slots':>16} {'adapted rows':>18} {'HF peft':>10}")
    for batch, row in rows.items():
        hf = row.get("hf_peft", {}).get("tokens_per_s")
        print(f"{batch:>5} {row['no_slots']['tokens_per_s']:>15.1f} "
              f"{row['slots_idle']['tokens_per_s']:>9.1f} ({row['slots_idle']['vs_no_slots']:.2f}x) "
              f"{row['adapted']['tokens_per_s']:>11.1f} ({row['adapted']['vs_no_slots']:.2f}x) "
              f"{'-' if hf is None else f'{hf:.1f}':>10}")
    if 1 in rows:
        step = rows[1]["adapted"]["seconds"] / args.tokens
        share = (weight_bytes + slot_bytes) / step / bandwidth
        print(f"batch 1 adapted: {step * 1e3:.2f} ms a token, {share:.0%} of the copy bandwidth")
    out = args.out or RESULTS / f"bench_lora_{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(args={k: str(v) for k, v in vars(args).items()}, bandwidth=bandwidth,
                                   weight_bytes=weight_bytes, slot_bytes=slot_bytes, rows=rows), indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
