"""`jaxinfer compare`: the subcommand's flags, and running it (table on the terminal, JSON and HTML under results/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxinfer.entrypoints.compare.extras import COMPARE_EXTRA, require
from jaxinfer.entrypoints.compare.verdicts import KINDS, THRESHOLDS

VERDICT_FAILED = 3  # exit status when a verdict fails (2 is bad input, 1 an unexpected error)


def parse_thresholds(pairs: list[str]) -> dict[str, float | None]:
    """`NAME=VALUE` flags (VALUE `none` drops the verdict) as a dict; a ValueError names a bad one."""
    out: dict[str, float | None] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in THRESHOLDS:
            raise ValueError(f"--threshold {pair!r} is not NAME=VALUE with NAME one of {', '.join(THRESHOLDS)}")
        if value.strip().lower() == "none":
            out[name] = None
            continue
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"--threshold {pair!r}: {value!r} is not a number (or none)") from None
    return out


def run_compare(args: argparse.Namespace) -> int:
    """Run the comparison, print the table and where the files went; exit 3 when a verdict fails."""
    require(*COMPARE_EXTRA)  # checked before any model loads
    from jaxinfer.entrypoints.compare.api import compare
    from jaxinfer.entrypoints.compare.report import print_table

    result = compare(
        args.a, args.b or None, reference=args.reference, dataset=args.dataset,
        max_prompts=args.max_prompts, max_tokens=args.max_tokens, sample_prompts=args.sample_prompts,
        samples=args.samples, sample_tokens=args.sample_tokens, temperature=args.temperature,
        held_out=args.held_out, max_windows=args.max_windows, expect=args.expect,
        thresholds=parse_thresholds(args.threshold), warm=not args.no_warmup, results_dir=args.results_dir,
        html=True, seed=args.seed, progress=lambda message: print(message, file=sys.stderr, flush=True),
    )
    print_table(result)
    print(f"wrote {result.json_path} and {result.html_path}")
    return 0 if result.passed else VERDICT_FAILED


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    """The `compare` subcommand."""
    cmp = sub.add_parser(
        "compare", help="A/B quality and cost of two configurations (or HF transformers) on the same prompts",
        description="Run the same prompts through configurations A and B (LLM keyword arguments) and report "
        "greedy agreement, teacher-forced top-1/KL/perplexity, a two-sample test of sampled tokens, and cost, "
        "with a verdict per metric. Exit status 0: every verdict passes; 3: one failed; 2: bad input.",
    )
    cmp.add_argument("--a", default="", metavar="KEY=VALUE,...",
                     help="A's LLM keyword arguments, e.g. dtype=bfloat16 (default: LLM's defaults, the demo model)")
    cmp.add_argument("--b", default="", metavar="KEY=VALUE,...",
                     help="B's, e.g. dtype=bfloat16,quantization=int8 or speculative=ngram|suffix or kv_cache_dtype=fp8")
    cmp.add_argument("--reference", choices=("hf",), default=None,
                     help="B is HF transformers (PyTorch) on A's checkpoint and dtype (instead of --b)")
    cmp.add_argument("--dataset", default=None, metavar="FILE",
                     help='prompts: JSONL ({"prompt": ...} per line) or ShareGPT JSON (default: the built-in sample)')
    cmp.add_argument("--max-prompts", type=int, default=16, help="prompts to use (default: %(default)s)")
    cmp.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt (default: %(default)s)")
    cmp.add_argument("--sample-prompts", type=int, default=4,
                     help="prompts also sampled for the two-sample test, 0 = none (default: %(default)s)")
    cmp.add_argument("--samples", type=int, default=32, help="sampled completions per prompt and side (default: %(default)s)")
    cmp.add_argument("--sample-tokens", type=int, default=16, help="tokens per sampled completion (default: %(default)s)")
    cmp.add_argument("--temperature", type=float, default=0.8, help="of the sampled run (default: %(default)s)")
    cmp.add_argument("--held-out", type=Path, default=None, metavar="FILE",
                     help='text scored under teacher forcing: a text file or JSON {"windows": [[ids]]} '
                     "(default: the built-in held-out Python source)")
    cmp.add_argument("--max-windows", type=int, default=8, help="256-token held-out windows (default: %(default)s)")
    cmp.add_argument("--expect", choices=("auto", *KINDS), default="auto",
                     help="which default thresholds apply (default: by what B changes)")
    cmp.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                     help=f"set a threshold (repeatable; VALUE none drops it): {', '.join(THRESHOLDS)}")
    cmp.add_argument("--results-dir", type=Path, default=Path("results"), help="JSON and HTML go here (default: %(default)s)")
    cmp.add_argument("--no-warmup", action="store_true",
                     help="time the first greedy pass (compilation included) instead of a second one")
    cmp.add_argument("--seed", type=int, default=0, help="sampling seeds and the test's permutations (default: %(default)s)")
    cmp.set_defaults(run=run_compare)
