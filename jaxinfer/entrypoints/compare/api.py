"""`jaxinfer.compare`: run one workload through two configurations and judge B against A."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping

from jaxinfer.entrypoints.compare.configs import HF_REFERENCE, Configuration, parse_configuration
from jaxinfer.entrypoints.compare.extras import require
from jaxinfer.entrypoints.compare.report import Comparison, result_stem, write_json
from jaxinfer.entrypoints.compare.runs import Run, run_llm
from jaxinfer.entrypoints.compare.scores import score
from jaxinfer.entrypoints.compare.verdicts import judge, resolve_thresholds
from jaxinfer.entrypoints.compare.workload import SAMPLE_HELD_OUT, Workload, load_prompts

Spec = str | Mapping[str, Any] | Configuration | None


def resolve_sides(a: Spec, b: Spec, reference: str | None) -> tuple[Configuration, Configuration]:
    """A and B as Configurations; `reference="hf"` makes B HF transformers on A's checkpoint."""
    if reference is not None and reference != HF_REFERENCE:
        raise ValueError(f"reference must be {HF_REFERENCE!r} (HF transformers on A's checkpoint), got {reference!r}")
    if reference is not None and b is not None:
        raise ValueError("give B's configuration (--b) or the HF reference (--reference hf), not both")
    side_a = parse_configuration(a, "A")
    if side_a.reference is not None:
        raise ValueError("A must be a jaxinfer configuration; the HF reference can only be B (reference='hf')")
    side_b = parse_configuration(HF_REFERENCE if reference else b, "B")
    return side_a, side_b


def run_side_b(side: Configuration, workload: Workload, a: Run, warm: bool) -> Run:
    """B's run on A's forced texts: jaxinfer, or the HF reference (imported only when asked for)."""
    if side.reference is not None:
        from jaxinfer.entrypoints.compare.hf_reference import run_hf

        return run_hf(workload, a, side.label)
    return run_llm(side, workload, 1, (a.forced_texts, a.held_out_count), warm)


def compare(
    a: Spec = None,
    b: Spec = None,
    *,
    reference: str | None = None,
    dataset: str | Path | None = None,
    max_prompts: int = 16,
    max_tokens: int = 64,
    sample_prompts: int = 4,
    samples: int = 32,
    sample_tokens: int = 16,
    temperature: float = 0.8,
    held_out: str | Path | None = None,
    max_windows: int = 8,
    expect: str = "auto",
    thresholds: Mapping[str, float | None] | None = None,
    warm: bool = True,
    results_dir: str | Path | None = "results",
    html: bool = True,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Comparison:
    """Run the same prompts through configurations A and B (LLM keyword sets) and judge B against A.

    a, b: `"key=value,..."` text, a dict of LLM kwargs, or a `Configuration` (which may carry an
    LLM already built from its kwargs); reference="hf" makes B HF transformers on A's checkpoint.
    Greedy outputs of the prompts (dataset: JSONL or ShareGPT, default the built-in sample) are
    compared token by token; `samples` sampled completions of the first `sample_prompts` prompts
    at `temperature` go through a two-sample test; the held-out text (default the built-in one)
    and each prompt with A's greedy output are scored under teacher forcing. Thresholds default by
    what B changes (see `verdicts`); `expect` forces a kind, `thresholds` sets or (None) drops any.
    JSON and (html=True) an HTML report go to `results_dir` (None: no files).
    """
    side_a, side_b = resolve_sides(a, b, reference)
    kinds, bounds = resolve_thresholds(side_a, side_b, expect, thresholds)  # bad names fail before any run
    if html and results_dir is not None:
        require("plotly")  # before minutes of runs, not after
    held_path = SAMPLE_HELD_OUT if held_out is None else Path(held_out)
    workload = Workload(load_prompts(dataset, max_prompts), max_tokens, sample_prompts, samples, sample_tokens,
                        temperature, held_path, max_windows=max_windows, seed=seed)
    say = progress or (lambda message: None)
    say(f"A: {len(workload.prompts)} greedy prompts, {workload.sample_prompts} x {workload.samples} samples, teacher forcing")
    run_a = run_llm(side_a, workload, 0, None, warm)
    say("B: running the same workload")
    run_b = run_side_b(side_b, workload, run_a, warm)
    comparison = judge_runs(run_a, run_b, workload, kinds, bounds)
    if results_dir is not None:
        stem = result_stem(Path(results_dir))
        if html:
            from jaxinfer.entrypoints.compare.html_report import write_html

            write_html(comparison, stem.with_suffix(".html"))
        write_json(comparison, stem.with_suffix(".json"))
    return comparison


def judge_runs(run_a: Run, run_b: Run, workload: Workload, kinds: list[str], thresholds: dict[str, float]
               ) -> Comparison:
    """Metrics and verdicts of two finished runs (what `compare` does once both sides ran)."""
    metrics, series = score(run_a, run_b, workload.seed)
    return Comparison(run_a.config, run_b.config, kinds, thresholds, metrics, judge(metrics, thresholds), series,
                      _describe(workload))


def _describe(workload: Workload) -> dict[str, Any]:
    """The workload's settings for the JSON (prompts by count, the held-out file by path)."""
    data = dataclasses.asdict(workload)
    data["prompts"] = len(workload.prompts)
    data["held_out"] = str(workload.held_out)
    del data["held_out_data"]
    return data
