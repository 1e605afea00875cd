"""Speculative decoding benchmark: jaxinfer plain / draft model / n-gram vs HF transformers
plain / `assistant_model` / `prompt_lookup_num_tokens`, on the same weights, in one run.

Greedy and temperature 0.8, batch 1 and 4; every request generates exactly --max-tokens tokens
(EOS ignored) so tokens/s compare like for like. Each configuration is warmed up (compiled) once
and timed --repeats times; the best wall time counts. HF assisted generation and prompt lookup
only support batch 1, so their batch-4 rows run the four prompts one after another.

    python scripts/bench_speculative.py                  # demo pair in jaxinfer/assets/demo
    python scripts/bench_speculative.py --target T --draft D --out results/x.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxinfer import LLM, SamplingParams, SpeculativeConfig  # noqa: E402

DEMO = ROOT / "jaxinfer" / "assets" / "demo"
PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    'class Stack:\n    """A last-in, first-out container."""\n\n    def __init__(self):\n',
    "    for index, line in enumerate(lines):\n",
]
MODES = {"greedy": 0.0, "t=0.8": 0.8}
BATCHES = (1, 4)


@dataclasses.dataclass
class Row:
    """One timed configuration."""

    mode: str
    batch: int
    engine: str
    tokens: int
    seconds: float
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    note: str = ""

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of wall time."""
        return self.tokens / self.seconds


def best_time(run, repeats: int) -> tuple[float, Any]:
    """Warm up once (compilation), then the best wall time of `repeats` runs and the last result."""
    result = run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return min(times), result


def spec_summary(outputs: list) -> tuple[float | None, float | None]:
    """Acceptance rate and mean accepted length (tokens per verifying pass) over a batch."""
    stats = [o.spec_stats for o in outputs if o.spec_stats]
    drafted = sum(s["drafted"] for s in stats)
    passes = sum(s["spec_passes"] for s in stats)
    accepted = sum(s["accepted"] for s in stats)
    if not drafted:
        return 0.0, None
    return accepted / drafted, (accepted + passes) / passes


def jaxinfer_rows(args: argparse.Namespace, prompts: list, max_seq_len: int) -> list[Row]:
    """Plain, draft-model and n-gram speculative decoding in jaxinfer, for every mode and batch."""
    engines = {
        "jaxinfer plain": None,
        "jaxinfer draft": SpeculativeConfig(
            method="draft", draft_model=str(args.draft), num_speculative_tokens=args.k, adaptive=not args.fixed_k
        ),
        "jaxinfer ngram": SpeculativeConfig(method="ngram", num_speculative_tokens=args.k, adaptive=not args.fixed_k),
    }
    rows = []
    for engine, spec in engines.items():
        llm = LLM(args.target, dtype="float32", max_seq_len=max_seq_len, max_batch_size=4, speculative=spec)
        for mode, temperature in MODES.items():
            for batch in BATCHES:
                params = [
                    SamplingParams(max_tokens=args.max_tokens, temperature=temperature, seed=i, ignore_eos=True)
                    for i in range(batch)
                ]
                seconds, outs = best_time(lambda: llm.generate(prompts[:batch], params), args.repeats)
                rate, length = spec_summary(outs) if spec else (None, None)
                rows.append(Row(mode, batch, engine, sum(len(o.token_ids) for o in outs), seconds, rate, length))
                print(f"  {engine:16s} {mode:7s} b={batch}: {rows[-1].tokens_per_s:8.1f} tok/s", flush=True)
    return rows


def hf_rows(args: argparse.Namespace, prompts: list) -> list[Row]:
    """HF transformers plain generate, assisted generation and prompt lookup on the same weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target, padding_side="left") if has_tokenizer(args.target) else None
    pad = target.config.pad_token_id if target.config.pad_token_id is not None else 0
    engines = {
        "hf plain": {},
        "hf assisted": {"assistant_model": draft},
        "hf prompt-lookup": {"prompt_lookup_num_tokens": args.k},
    }
    rows = []
    for engine, extra in engines.items():
        for mode, temperature in MODES.items():
            sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
            common = dict(max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens, pad_token_id=pad, **sampling)
            for batch in BATCHES:
                sequential = bool(extra) and batch > 1  # HF speculative methods are batch-1 only

                def run() -> int:
                    groups = [[p] for p in prompts[:batch]] if sequential else [prompts[:batch]]
                    made = 0
                    for group in groups:
                        inputs = encode_hf(tokenizer, group)
                        with torch.no_grad():
                            out = target.generate(**inputs, **common, **extra)
                        made += (out.shape[1] - inputs["input_ids"].shape[1]) * out.shape[0]
                    return made

                torch.manual_seed(0)
                seconds, tokens = best_time(run, args.repeats)
                note = "prompts one at a time (batch-1 only)" if sequential else ""
                rows.append(Row(mode, batch, engine, tokens, seconds, note=note))
                print(f"  {engine:16s} {mode:7s} b={batch}: {rows[-1].tokens_per_s:8.1f} tok/s", flush=True)
    return rows


def has_tokenizer(path: Path) -> bool:
    """True when the checkpoint directory ships HF tokenizer files."""
    return any((Path(path) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))


def encode_hf(tokenizer: Any, prompts: list) -> dict:
    """Left-padded input ids and attention mask for HF generate (token-id prompts when no tokenizer)."""
    import torch

    if tokenizer is not None:
        return dict(tokenizer(prompts, return_tensors="pt", padding=True))
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return {"input_ids": ids, "attention_mask": mask}


def ratios(rows: list[Row]) -> dict[str, float]:
    """Speedups the issue asks about, keyed like 'draft_vs_plain/greedy/b1'."""
    speed = {(r.engine, r.mode, r.batch): r.tokens_per_s for r in rows}
    pairs = {
        "draft_vs_plain": ("jaxinfer draft", "jaxinfer plain"),
        "ngram_vs_plain": ("jaxinfer ngram", "jaxinfer plain"),
        "draft_vs_hf_assisted": ("jaxinfer draft", "hf assisted"),
        "ngram_vs_hf_prompt_lookup": ("jaxinfer ngram", "hf prompt-lookup"),
        "plain_vs_hf_plain": ("jaxinfer plain", "hf plain"),
    }
    out = {}
    for name, (a, b) in pairs.items():
        for mode in MODES:
            for batch in BATCHES:
                if (a, mode, batch) in speed and (b, mode, batch) in speed:
                    out[f"{name}/{mode}/b{batch}"] = speed[(a, mode, batch)] / speed[(b, mode, batch)]
    return out


def print_table(rows: list[Row]) -> None:
    """Rows grouped by mode and batch, with the speedup over jaxinfer plain."""
    plain = {(r.mode, r.batch): r.tokens_per_s for r in rows if r.engine == "jaxinfer plain"}
    print(f"\n{'mode':7s} {'batch':>5s}  {'engine':17s} {'tok/s':>8s} {'vs plain':>8s} {'accept':>7s} {'mean len':>8s}  note")
    for r in sorted(rows, key=lambda r: (list(MODES).index(r.mode), r.batch)):
        base = plain.get((r.mode, r.batch))
        vs = f"{r.tokens_per_s / base:7.2f}x" if base else ""
        acc = f"{r.acceptance_rate:7.2f}" if r.acceptance_rate is not None else ""
        mean = f"{r.mean_accepted_length:8.2f}" if r.mean_accepted_length is not None else ""
        print(f"{r.mode:7s} {r.batch:5d}  {r.engine:17s} {r.tokens_per_s:8.1f} {vs:>8s} {acc:>7s} {mean:>8s}  {r.note}")


def main() -> None:
    """Parse flags, run every configuration, print the table and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=DEMO / "target")
    parser.add_argument("--draft", type=Path, default=DEMO / "draft")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens (k_max when adaptive)")
    parser.add_argument("--fixed-k", action="store_true", help="turn adaptive draft length off")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-hf", action="store_true", help="skip the HF transformers rows")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_speculative.json")
    args = parser.parse_args()
    for path in (args.target, args.draft):
        if not (path / "config.json").is_file():
            parser.error(f"{path} is not a checkpoint directory (train the demo pair with scripts/train_demo.py)")
    prompts: list = PROMPTS
    if not has_tokenizer(args.target):  # random test checkpoints: fixed token-id prompts
        prompts = [np.random.RandomState(i).randint(3, 200, size=8 + 4 * i).tolist() for i in range(4)]
    longest = max(len(p) for p in prompts) * 2 + args.max_tokens + args.k + 1
    max_seq_len = 1 << (longest - 1).bit_length()
    print(f"target {args.target}\ndraft  {args.draft}\nk={args.k} adaptive={not args.fixed_k} "
          f"max_tokens={args.max_tokens} max_seq_len={max_seq_len}")
    rows = jaxinfer_rows(args, prompts, max_seq_len)
    if not args.no_hf:
        rows += hf_rows(args, prompts)
    print_table(rows)
    result = {
        "target": str(args.target),
        "draft": str(args.draft),
        "k": args.k,
        "adaptive": not args.fixed_k,
        "max_tokens": args.max_tokens,
        "max_seq_len": max_seq_len,
        "repeats": args.repeats,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "rows": [{**dataclasses.asdict(r), "tokens_per_s": r.tokens_per_s} for r in rows],
        "ratios": ratios(rows),
    }
    print("\n" + "\n".join(f"{k:40s} {v:6.2f}x" for k, v in result["ratios"].items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
