"""Speculative decoding benchmark: jaxinfer plain / draft model / n-gram / EAGLE head vs HF
transformers plain / `assistant_model` / `prompt_lookup_num_tokens`, on the same weights, in one run.
Every jaxinfer row runs `LLM.generate`, the serving engine (what `LLM.stream` and the server run).

Greedy and temperature 0.8, batch 1, 4 and 16 (--batches; the four prompts repeat); every request
generates exactly --max-tokens tokens (EOS ignored) so tokens/s compare like for like. Both
libraries run float32 on CPU; torch gets --torch-threads intra-op threads (default 1:
multi-threaded torch collapses on a loaded 2-core box). Each configuration is warmed up (compiled)
once, then the engines of one mode and batch are timed round-robin --repeats times: tok/s is the
median over rounds, and "vs plain" the median over rounds of the speedup within the round (the
machine's speed drifts between rounds; within one it is shared). HF assisted generation
and prompt lookup only support batch 1, so their larger-batch rows run the prompts in turn.

    python scripts/bench_speculative.py                  # demo pair and head in jaxinfer/assets/demo
    python scripts/bench_speculative.py --workload edit --methods plain ngram --no-hf   # code editing
    python scripts/bench_speculative.py --workload template --methods plain ngram suffix --no-hf --batches 1
    python scripts/bench_speculative.py --target T --draft D --eagle E --out results/x.json

Speculative rows also print the acceptance at each draft position (accepted / drafted there), the
cost of a draft step and of a verify pass in plain decode steps as the engine priced them (its
measured step times once both kinds are timed, the heuristic before), the ideal speedup those imply (tokens
per verify pass over the cost of a round) and the achieved speedup as a fraction of the best an
adaptive loop can do, max(ideal, 1): where rounds cannot pay it should decode plainly.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxinfer import LLM, SamplingParams, SpeculativeConfig  # noqa: E402
from jaxinfer.config.buckets import bucket  # noqa: E402
from jaxinfer.speculative.round_plan import CostModel, on_host, round_cost  # noqa: E402

DEMO = ROOT / "jaxinfer" / "assets" / "demo"
PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    'class Stack:\n    """A last-in, first-out container."""\n\n    def __init__(self):\n',
    "    for index, line in enumerate(lines):\n",
]
# Code-editing style (the n-gram proposer's case): each prompt holds the code that is being rewritten.
EDIT_SOURCE = [
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n    return total / len(values)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n    def norm(self):\n"
    "        return (self.x ** 2 + self.y ** 2) ** 0.5\n",
    "import os\n\n\ndef list_python_files(root):\n    found = []\n    for name in os.listdir(root):\n"
    "        if name.endswith('.py'):\n            found.append(os.path.join(root, name))\n    return found\n",
    "def read_lines(path):\n    with open(path) as handle:\n        return [line.rstrip() for line in handle]\n",
]
EDIT_PROMPTS = [f"{code}\n\n# The same code, unchanged:\n{code.splitlines()[0]}\n" for code in EDIT_SOURCE]
# Repeated structure (suffix decoding's case): unit-test stubs for four classes, whose outputs share
# a template. A run sends them in turn, --batch at a time, so later requests can draft from earlier
# outputs; suffix decoding's shared outputs are cleared before each run, so no run sees an earlier
# round's (identical, greedy) outputs.
TEMPLATE_PROMPTS = [
    f"import unittest\n\n\nclass Test{name}(unittest.TestCase):\n    def test_{method}(self):\n"
    for name, method in [("Parser", "parse"), ("Stack", "push"), ("Queue", "pop"), ("Cache", "get")]
]
WORKLOADS = {"code": PROMPTS, "edit": EDIT_PROMPTS, "template": TEMPLATE_PROMPTS}
IN_TURN = {"template"}  # workloads whose runs send every prompt, in turns of the batch size
MODES = {"greedy": 0.0, "t=0.8": 0.8}
BATCHES = (1, 4, 16)  # 16: where adaptive speculation should have switched itself off


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
    acceptance_per_position: list[float | None] | None = None
    tokens_per_pass: float | None = None  # decoded tokens per target pass (verify or plain), prefill aside
    draft_step_cost: float | None = None  # plain decode steps
    verify_cost: float | None = None  # plain decode steps, a round that drafts nothing
    ideal_speedup: float | None = None  # tokens per verify pass / (verify + draft steps per pass * draft step)
    cost_source: str = ""
    chained_verify: int | None = None  # verify calls started before the call ahead landed, over the timed rounds
    note: str = ""
    round_seconds: list[float] = dataclasses.field(default_factory=list)  # one per round-robin round

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of wall time."""
        return self.tokens / self.seconds


def batch_of(prompts: list, batch: int) -> list:
    """`batch` prompts, cycling through the workload's."""
    return [prompts[i % len(prompts)] for i in range(batch)]


def round_robin_times(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, tuple[list[float], Any]]:
    """Warm every run up once (compilation), then time them round-robin; wall times per round and last result each.

    Interleaving keeps a burst of load from other processes from landing on one engine only, and
    every other round runs them in reverse, so no engine always follows the same one.
    """
    results = {name: run() for name, run in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(repeats):
        for name in list(runs) if round_ % 2 == 0 else list(runs)[::-1]:
            start = time.perf_counter()
            results[name] = runs[name]()
            times[name].append(time.perf_counter() - start)
    return {name: (times[name], results[name]) for name in runs}


def per_round_speedups(row: Row, base: Row) -> list[float] | None:
    """Row's throughput over base's in each round, where both were timed in the same rounds
    (jaxinfer rows with jaxinfer rows, HF with HF); else None."""
    interleaved = row.engine.split()[0] == base.engine.split()[0] and len(row.round_seconds) == len(base.round_seconds)
    if not interleaved or not row.round_seconds:
        return None
    return [(row.tokens / a) / (base.tokens / b) for a, b in zip(row.round_seconds, base.round_seconds)]


def speedup(row: Row, base: Row) -> float:
    """Median over rounds of row's throughput over base's in the same round (see per_round_speedups);
    else the ratio of medians."""
    per_round = per_round_speedups(row, base)
    return row.tokens_per_s / base.tokens_per_s if per_round is None else float(np.median(per_round))


def spread(row: Row, base: Row) -> tuple[float, float] | None:
    """The quartiles of the per-round speedups: how far one run's median may be from the next run's
    on a noisy machine (a target met only inside this range is not met for sure)."""
    per_round = per_round_speedups(row, base)
    return None if per_round is None else tuple(float(q) for q in np.quantile(per_round, [0.25, 0.75]))


def spec_summary(outputs: list) -> tuple[float | None, float | None, list[float | None] | None]:
    """Acceptance rate, mean accepted length (tokens per verifying pass) and acceptance at each
    draft position (accepted / drafted there) over a batch."""
    stats = [o.spec_stats for o in outputs if o.spec_stats]
    drafted = sum(s["drafted"] for s in stats)
    passes = sum(s["spec_passes"] for s in stats)
    accepted = sum(s["accepted"] for s in stats)
    if not drafted:
        return 0.0, None, None
    rates = np.array([[np.nan if a is None else a for a in s["acceptance_per_position"]] for s in stats], float)
    measured = np.sum(~np.isnan(rates), axis=0)  # rows that drafted at each position
    means = np.nansum(rates, axis=0) / np.maximum(measured, 1)
    positions = [float(m) if n else None for m, n in zip(means, measured)]
    return accepted / drafted, (accepted + passes) / passes, positions


def tokens_per_pass(outputs: list) -> float | None:
    """Decoded tokens (the prefill's first aside) per target pass, verifying or plain, over a batch's
    requests as if each ran alone (batch 1: exactly the target passes it took)."""
    stats = [(len(o.token_ids), o.spec_stats) for o in outputs if o.spec_stats]
    if not stats:
        return None
    decoded = sum(n - 1 for n, _ in stats)
    emitted = [round(s["tokens_per_target_pass"] * s["target_passes"]) for _, s in stats]  # by verify steps
    passes = sum(s["target_passes"] + (n - 1 - e) for (n, s), e in zip(stats, emitted))  # verify + plain steps
    return decoded / max(passes, 1)


def in_turns(generate: Callable, llm: LLM, prompts: list, params: list[SamplingParams], batch: int) -> list:
    """Every prompt, `batch` at a time (later turns may draw on earlier outputs), from a cleared
    suffix cache."""
    suffix = llm.engine.speculator.suffix if llm.engine.speculator is not None else None
    if suffix is not None:
        suffix.forget()
    return [out for i in range(0, len(prompts), batch)
            for out in generate(llm, prompts[i : i + batch], params[: len(prompts[i : i + batch])])]


def round_costs(llm: LLM, batch: int) -> tuple[CostModel, str]:
    """The cost model the engine planned this batch with, and whether it was measured or the heuristic."""
    speculator = llm.engine.speculator
    measured = None if speculator.measured is None else speculator.measured.cost_model(bucket(batch))
    return (speculator.heuristic, "heuristic") if measured is None else (measured, "measured")


def priced_row(row: Row, llm: LLM, outputs: list, k: int, greedy: bool) -> Row:
    """The row with its draft-step and verify-pass costs and the ideal speedup they imply."""
    costs, source = round_costs(llm, row.batch)
    stats = [o.spec_stats for o in outputs if o.spec_stats]
    passes = sum(s["spec_passes"] for s in stats)
    per_round = np.asarray(round_cost(row.batch, np.bool_(greedy), on_host(costs), k), np.float64)
    mode = 0 if greedy else 1
    draft_step, verify = float(np.asarray(costs.per_draft)[mode]), float(per_round[0])
    ideal = None
    if passes and row.mean_accepted_length is not None:
        steps = sum(s["drafted"] for s in stats) / passes  # draft steps per verify pass (batch 1: exact)
        ideal = row.mean_accepted_length / (verify + steps * draft_step)
    return dataclasses.replace(row, draft_step_cost=draft_step, verify_cost=verify, ideal_speedup=ideal,
                               cost_source=source)


def jaxinfer_rows(args: argparse.Namespace, prompts: list, max_seq_len: int) -> list[Row]:
    """Plain, draft-model and n-gram speculative decoding in jaxinfer, for every mode and batch."""
    engines = {
        "jaxinfer plain": None,
        "jaxinfer draft": SpeculativeConfig(
            method="draft", draft_model=str(args.draft), num_speculative_tokens=args.k, adaptive=not args.fixed_k
        ),
        "jaxinfer ngram": SpeculativeConfig(
            method="ngram", num_speculative_tokens=args.k, adaptive=not args.fixed_k
        ),
        "jaxinfer ngram_device": SpeculativeConfig(
            method="ngram_device", num_speculative_tokens=args.k, adaptive=not args.fixed_k
        ),
        "jaxinfer suffix": SpeculativeConfig(
            method="suffix", num_speculative_tokens=args.k, adaptive=not args.fixed_k
        ),
        "jaxinfer eagle": SpeculativeConfig(
            method="eagle", draft_model=str(args.eagle), num_speculative_tokens=args.k, adaptive=not args.fixed_k
        ),
        "jaxinfer mtp": SpeculativeConfig(  # the target's own MTP layer: a DeepSeek-V3 or GLM-4.5 --target
            method="mtp", num_speculative_tokens=args.k, adaptive=not args.fixed_k
        ),
    }
    engines = {name: spec for name, spec in engines.items() if name.split()[-1] in args.methods}
    llms = {
        engine: LLM(args.target, dtype=args.dtype, max_seq_len=max_seq_len, max_num_seqs=max(args.batches),
                    speculative=spec)
        for engine, spec in engines.items()
    }
    for llm in llms.values():  # every engine program, so no row's timing holds a compile
        llm.engine.warmup()
    rows = []
    for mode, temperature in [(m, MODES[m]) for m in args.modes]:
        for batch in args.batches:
            params = [
                SamplingParams(max_tokens=args.max_tokens, temperature=temperature, seed=i, ignore_eos=True)
                for i in range(batch)
            ]
            batch_prompts = batch_of(prompts, batch)
            runs = {
                name: functools.partial(LLM.generate, llm, batch_prompts, params)
                for name, llm in llms.items()
            }
            if args.workload in IN_TURN:
                params = [dataclasses.replace(params[0], seed=i) for i in range(max(batch, len(prompts)))]
                runs = {
                    name: functools.partial(in_turns, LLM.generate, llm, batch_of(prompts, max(batch, len(prompts))),
                                            params, batch)
                    for name, llm in llms.items()
                }
            before = {name: chained_verify_calls(llm) for name, llm in llms.items()}
            for engine, (seconds, outs) in round_robin_times(runs, args.repeats).items():
                rate, length, positions = spec_summary(outs) if engines[engine] else (None, None, None)
                row = Row(mode, batch, engine, sum(len(o.token_ids) for o in outs), float(np.median(seconds)), rate,
                          length, positions, tokens_per_pass(outs), round_seconds=seconds,
                          chained_verify=chained_verify_calls(llms[engine]) - before[engine])
                if engines[engine]:
                    row = priced_row(row, llms[engine], outs, args.k, temperature == 0)
                rows.append(row)
                print(f"  {engine:16s} {mode:7s} b={batch}: {rows[-1].tokens_per_s:8.1f} tok/s", flush=True)
    return rows


def chained_verify_calls(llm: LLM) -> int:
    """Verify calls the engine started before the call ahead of them landed (async scheduling), so far."""
    return llm.metrics()["engine_chained_verify_calls"]


def hf_rows(args: argparse.Namespace, prompts: list) -> list[Row]:
    """HF transformers plain generate, assisted generation and prompt lookup on the same weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.torch_threads)
    dtype = getattr(torch, args.dtype)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype).eval()
    tokenizer = None
    if has_tokenizer(args.target):
        tokenizer = AutoTokenizer.from_pretrained(args.target, padding_side="left")
    pad = target.config.pad_token_id if target.config.pad_token_id is not None else 0
    engines = {
        "hf plain": {},
        "hf assisted": {"assistant_model": draft},
        "hf prompt-lookup": {"prompt_lookup_num_tokens": args.k},
    }
    rows = []
    for mode, temperature in [(m, MODES[m]) for m in args.modes]:
        sampling = dict(do_sample=bool(temperature))
        if temperature:
            sampling.update(temperature=temperature, top_k=0, top_p=1.0)
        common = dict(max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens, pad_token_id=pad, **sampling)
        for batch in args.batches:
            runs = {
                name: functools.partial(
                    hf_generate, target, tokenizer, batch_of(prompts, batch), {**common, **extra}
                )
                for name, extra in engines.items()
            }
            torch.manual_seed(0)
            for engine, (seconds, tokens) in round_robin_times(runs, args.repeats).items():
                note = "prompts one at a time (batch-1 only)" if engines[engine] and batch > 1 else ""
                rows.append(Row(mode, batch, engine, tokens, float(np.median(seconds)), note=note,
                                round_seconds=seconds))
                print(f"  {engine:16s} {mode:7s} b={batch}: {rows[-1].tokens_per_s:8.1f} tok/s", flush=True)
    return rows


def hf_generate(model: Any, tokenizer: Any, prompts: list, kwargs: dict) -> int:
    """Generated token count; HF speculative methods (assistant, prompt lookup) are batch-1 only."""
    import torch

    speculative = "assistant_model" in kwargs or "prompt_lookup_num_tokens" in kwargs
    groups = [[p] for p in prompts] if speculative else [prompts]
    made = 0
    for group in groups:
        inputs = encode_hf(tokenizer, group)
        with torch.no_grad():
            out = model.generate(**inputs, **kwargs)
        made += (out.shape[1] - inputs["input_ids"].shape[1]) * out.shape[0]
    return made


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


def ratios(rows: list[Row], measure: Callable = speedup) -> dict:
    """Speedups the issue asks about (or another `measure` of a row against its base, e.g. `spread`),
    keyed like 'draft_vs_plain/greedy/b1'."""
    found = {(r.engine, r.mode, r.batch): r for r in rows}
    pairs = {
        "draft_vs_plain": ("jaxinfer draft", "jaxinfer plain"),
        "ngram_vs_plain": ("jaxinfer ngram", "jaxinfer plain"),
        "ngram_device_vs_plain": ("jaxinfer ngram_device", "jaxinfer plain"),
        "ngram_device_vs_ngram": ("jaxinfer ngram_device", "jaxinfer ngram"),
        "suffix_vs_plain": ("jaxinfer suffix", "jaxinfer plain"),
        "suffix_vs_ngram": ("jaxinfer suffix", "jaxinfer ngram"),
        "eagle_vs_plain": ("jaxinfer eagle", "jaxinfer plain"),
        "draft_vs_hf_assisted": ("jaxinfer draft", "hf assisted"),
        "ngram_vs_hf_prompt_lookup": ("jaxinfer ngram", "hf prompt-lookup"),
        "plain_vs_hf_plain": ("jaxinfer plain", "hf plain"),
    }
    out = {}
    for name, (a, b) in pairs.items():
        for mode in MODES:
            for batch in sorted({r.batch for r in rows}):
                if (a, mode, batch) in found and (b, mode, batch) in found:
                    out[f"{name}/{mode}/b{batch}"] = measure(found[(a, mode, batch)], found[(b, mode, batch)])
    return out


def print_table(rows: list[Row]) -> None:
    """Rows grouped by mode and batch, with the speedup over jaxinfer plain."""
    plain = {(r.mode, r.batch): r for r in rows if r.engine == "jaxinfer plain"}
    header = ["mode".ljust(7), "batch".rjust(5), " engine".ljust(18), "tok/s".rjust(8), "vs plain".rjust(8)]
    costs = ["draft".rjust(6), "verify".rjust(6), "ideal".rjust(6), "of best".rjust(8)]
    print("\n" + " ".join(header + ["accept".rjust(7), "mean len".rjust(8), "tok/pass".rjust(8)] + costs
                          + [" per position / note"]))
    for r in sorted(rows, key=lambda r: (list(MODES).index(r.mode), r.batch)):
        base = plain.get((r.mode, r.batch))
        gain = speedup(r, base) if base else None
        vs = f"{gain:7.2f}x" if base else ""
        acc = f"{r.acceptance_rate:7.2f}" if r.acceptance_rate is not None else ""
        mean = f"{r.mean_accepted_length:8.2f}" if r.mean_accepted_length is not None else ""
        per_pass = f"{r.tokens_per_pass:8.2f}" if r.tokens_per_pass is not None else ""
        priced = [f"{c:6.2f}" if c is not None else "" for c in (r.draft_step_cost, r.verify_cost, r.ideal_speedup)]
        of_ideal = f"{gain / max(r.ideal_speedup, 1.0):7.0%}" if base and r.ideal_speedup else ""
        positions = " ".join("-" if a is None else f"{a:.2f}" for a in r.acceptance_per_position or [])
        chained = f"; {r.chained_verify} verify calls chained" if r.chained_verify else ""
        note = f"{positions} ({r.cost_source} costs{chained})" if r.cost_source else positions or r.note
        print(f"{r.mode:7s} {r.batch:5d}  {r.engine:17s} {r.tokens_per_s:8.1f} {vs:>8s} {acc:>7s} {mean:>8s} {per_pass:>8s} "
              f"{' '.join(f'{c:>6s}' for c in priced)} {of_ideal:>8s}  {note}")


def main() -> None:
    """Parse flags, run every configuration, print the table and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=DEMO / "target")
    parser.add_argument("--draft", type=Path, default=DEMO / "draft")
    parser.add_argument("--eagle", type=Path, default=DEMO / "eagle", help="EAGLE draft head for --target")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="code",
                        help="code: open-ended prompts; edit: prompts holding the code being rewritten (n-gram's case); "
                        "template: prompts whose outputs share a template, sent in turn (suffix decoding's case)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="both models, both engines")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens (k_max when adaptive)")
    parser.add_argument("--fixed-k", action="store_true", help="turn adaptive draft length off")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), help="batch sizes to time")
    parser.add_argument("--no-hf", action="store_true", help="skip the HF transformers rows")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="sampling modes to time")
    parser.add_argument(
        "--methods", nargs="+",
        choices=["plain", "draft", "ngram", "ngram_device", "suffix", "eagle", "mtp"],
        default=["plain", "draft", "ngram", "eagle"],
        help="jaxinfer engines to run (mtp: the --target checkpoint's own MTP layer, DeepSeek-V3 or GLM-4.5)",
    )
    parser.add_argument(
        "--torch-threads", type=int, default=1,
        help="torch intra-op threads for HF (1 is fastest for these tiny models on a shared 2-core CPU)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_speculative.json")
    args = parser.parse_args()
    for path in (args.target, args.draft):
        if not (path / "config.json").is_file():
            parser.error(f"{path} is not a checkpoint directory (train the demo pair with scripts/train_demo.py)")
    prompts: list = WORKLOADS[args.workload]
    if has_tokenizer(args.target):
        from transformers import AutoTokenizer

        prompt_tokens = max(len(AutoTokenizer.from_pretrained(args.target).encode(p)) for p in prompts)
    else:  # random test checkpoints: fixed token-id prompts
        prompts = [np.random.RandomState(i).randint(3, 200, size=8 + 4 * i).tolist() for i in range(4)]
        prompt_tokens = max(map(len, prompts))
    longest = prompt_tokens + args.max_tokens + args.k + 1
    max_seq_len = 1 << (longest - 1).bit_length()
    print(f"target {args.target}\ndraft  {args.draft}\ndtype={args.dtype} k={args.k} adaptive={not args.fixed_k} "
          f"max_tokens={args.max_tokens} max_seq_len={max_seq_len}")
    rows = jaxinfer_rows(args, prompts, max_seq_len)
    if not args.no_hf:
        rows += hf_rows(args, prompts)
    print_table(rows)
    result = {
        "target": str(args.target),
        "draft": str(args.draft),
        "dtype": args.dtype,
        "k": args.k,
        "adaptive": not args.fixed_k,
        "max_tokens": args.max_tokens,
        "max_seq_len": max_seq_len,
        "repeats": args.repeats,
        "torch_threads": args.torch_threads,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "rows": [{**dataclasses.asdict(r), "tokens_per_s": r.tokens_per_s} for r in rows],
        "ratios": ratios(rows),
        "ratio_quartiles": ratios(rows, spread),
    }
    quartiles = result["ratio_quartiles"]
    print("\n" + "\n".join(f"{k:40s} {v:6.2f}x" + (f"  (rounds' quartiles {quartiles[k][0]:.2f}-{quartiles[k][1]:.2f})"
                                                   if quartiles.get(k) else "") for k, v in result["ratios"].items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
