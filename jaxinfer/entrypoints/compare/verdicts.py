"""Verdicts: each metric against a threshold, the defaults chosen by what B changes relative to A.

Lossless changes (speculation, prefix caching, scheduling knobs) must match A exactly in greedy
mode and sample the same distributions. Weight quantization keeps the accuracy gates of
tests/test_quantization.py on held-out text (top-1 agreement, perplexity increase); a quantized KV
cache keeps tests/test_kv_fp8.py's greedy agreement; any other change (dtype, kernels, attention
backend, the HF reference) gets int8's gates: "as close as int8 quantization". With several changes
each threshold takes the loosest of their defaults; the user can set or drop any of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.entrypoints.compare.configs import Configuration, changed_keys

# Threshold name -> (metric group, metric, comparison): what each threshold bounds.
THRESHOLDS: dict[str, tuple[str, str, str]] = {
    "greedy_exact_min": ("greedy", "exact_match", ">="),
    "greedy_position_min": ("greedy", "position_match", ">="),
    "top1_min": ("held_out", "top1_agreement", ">="),
    "ppl_increase_max": ("held_out", "perplexity_increase", "<="),
    "kl_mean_max": ("held_out", "kl_mean", "<="),
    "distribution_p_min": ("sampled", "p_value", ">="),
}
ALPHA = 0.01  # the two-sample test's level: a lossless change fails it 1% of the time by chance
QUANT_GATES = {"int8": (0.99, 0.01), "int4": (0.95, 0.05)}  # tests/test_quantization.py GATES
KV_GREEDY_GATE = 0.95  # tests/test_kv_fp8.py: mean per-position greedy agreement with the bf16 pool


def _gates(top1: float, ppl: float) -> dict[str, float]:
    return {"top1_min": top1, "ppl_increase_max": ppl, "distribution_p_min": ALPHA}


DEFAULTS: dict[str, dict[str, float]] = {
    "lossless": {"greedy_exact_min": 1.0, "top1_min": 1.0, "distribution_p_min": ALPHA},
    "int8": _gates(*QUANT_GATES["int8"]),
    "int4": _gates(*QUANT_GATES["int4"]),
    "fp8": _gates(*QUANT_GATES["int4"]),  # the quantization tests gate no fp8 weights: int4's, the looser
    "kv_int8": {"greedy_position_min": KV_GREEDY_GATE, "distribution_p_min": ALPHA},
    "kv_fp8": {"greedy_position_min": KV_GREEDY_GATE, "distribution_p_min": ALPHA},
    "numerics": _gates(*QUANT_GATES["int8"]),
}
KINDS = tuple(DEFAULTS)
LOSSLESS_KEYS = frozenset({
    "speculative", "enable_prefix_caching", "decode_steps", "stream_interval", "overlap_outputs", "async_scheduling",
    "max_num_seqs", "max_num_batched_tokens", "max_prefill_seqs", "num_pages", "gpu_memory_utilization", "compile_cache",
})


def kind_of_change(key: str, b: Any, b_kwargs: Mapping[str, Any]) -> str:
    """The kind of one changed LLM keyword argument, given B's value and all of B's kwargs."""
    if key in LOSSLESS_KEYS:
        return "lossless"
    if key in ("quantization", "quantize_lm_head"):  # B's mode sets the gates (int8 -> int4 too)
        mode = b_kwargs.get("quantization")
        return mode if mode in ("int8", "int4", "fp8") else "numerics"
    if key == "kv_cache_dtype" and b in ("int8", "fp8"):
        return f"kv_{b}"
    return "numerics"


def kinds(a: Configuration, b: Configuration) -> list[str]:
    """The kinds of what B changes (lossless when nothing changes: a run-to-run determinism check)."""
    if b.reference is not None:
        return ["numerics"]
    found = {kind_of_change(key, vb, b.kwargs) for key, (_, vb) in changed_keys(a, b).items()}
    lossy = sorted(found - {"lossless"})
    return lossy or ["lossless"]


def loosest(kind_list: list[str]) -> dict[str, float]:
    """Per threshold, the loosest default among the kinds (lowest minimum, highest maximum)."""
    merged: dict[str, float] = {}
    for kind in kind_list:
        for name, value in DEFAULTS[kind].items():
            pick = min if name.endswith("_min") else max
            merged[name] = pick(merged[name], value) if name in merged else value
    return merged


def resolve_thresholds(a: Configuration, b: Configuration, expect: str = "auto",
                       overrides: Mapping[str, float | None] | None = None) -> tuple[list[str], dict[str, float]]:
    """The kinds (detected, or `expect`) and their thresholds with the user's overrides (None drops one)."""
    if expect != "auto" and expect not in KINDS:
        raise ValueError(f"expect must be auto or one of {', '.join(KINDS)}, got {expect!r}")
    kind_list = kinds(a, b) if expect == "auto" else [expect]
    thresholds = loosest(kind_list)
    for name, value in (overrides or {}).items():
        if name not in THRESHOLDS:
            raise ValueError(f"unknown threshold {name!r}; accepted: {', '.join(THRESHOLDS)}")
        if value is None:
            thresholds.pop(name, None)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"threshold {name} must be a number or None, got {value!r}")
        else:
            thresholds[name] = float(value)
    return kind_list, thresholds


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One metric against its threshold; passed is None where the metric was not measured."""

    threshold: str
    metric: str
    value: float | None
    bound: float
    op: str
    passed: bool | None


def judge(metrics: Mapping[str, Mapping[str, Any]], thresholds: Mapping[str, float]) -> list[Verdict]:
    """A verdict for every threshold set."""
    verdicts = []
    for name, bound in thresholds.items():
        group, metric, op = THRESHOLDS[name]
        value = metrics.get(group, {}).get(metric)
        passed = None if value is None else (value >= bound if op == ">=" else value <= bound)
        verdicts.append(Verdict(name, f"{group}.{metric}", value, bound, op, passed))
    return verdicts
