"""A comparison's outcome: the result object, its JSON file and the terminal table (rich)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

from jaxinfer.entrypoints.compare.extras import require
from jaxinfer.entrypoints.compare.verdicts import Verdict


@dataclasses.dataclass
class Comparison:
    """What `compare` returns: configurations, metrics, verdicts and where the files went."""

    a: dict[str, str]
    b: dict[str, str]
    kinds: list[str]  # what B changes: lossless, int8, int4, fp8, kv_int8, kv_fp8, numerics
    thresholds: dict[str, float]
    metrics: dict[str, dict[str, Any]]
    verdicts: list[Verdict]
    series: dict[str, Any]  # per-position agreement, KL values, latencies: the plots' data
    workload: dict[str, Any]
    json_path: Path | None = None
    html_path: Path | None = None

    @property
    def passed(self) -> bool:
        """True when no verdict failed (an unmeasured metric does not fail)."""
        return all(v.passed is not False for v in self.verdicts)

    def failures(self) -> list[Verdict]:
        """The verdicts that failed."""
        return [v for v in self.verdicts if v.passed is False]

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready data (NaN and infinities as null)."""
        data = dataclasses.asdict(self)
        data["passed"] = self.passed
        for key in ("json_path", "html_path"):
            data[key] = None if data[key] is None else str(data[key])
        return _finite(data)


def _finite(value: Any) -> Any:
    """NaN/inf floats as None, recursively (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def result_stem(results_dir: Path) -> Path:
    """results/compare-YYYYmmdd-HHMMSS (with a counter when that second is taken)."""
    stem = results_dir / time.strftime("compare-%Y%m%d-%H%M%S")
    candidate, n = stem, 1
    while candidate.with_suffix(".json").exists():
        candidate, n = stem.with_name(f"{stem.name}-{n}"), n + 1
    return candidate


def write_json(comparison: Comparison, path: Path) -> Path:
    """The comparison as JSON at `path` (its directory made if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    comparison.json_path = path
    path.write_text(json.dumps(comparison.to_dict(), indent=1))
    return path


def describe_config(config: dict[str, str]) -> str:
    """`key=value, ...` of a side's configuration ("LLM defaults" when empty)."""
    return ", ".join(f"{k}={v}" for k, v in config.items()) or "LLM defaults"


def _num(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}g}"


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.2f} MB"


def _ms(summary: dict[str, float | None], key: str) -> str:
    return "-" if summary.get(key) is None else f"{summary[key] * 1e3:.1f} ms"


def quality_rows(metrics: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(label, metric key, A, B) of the quality metrics (pairwise ones show in B's column)."""
    g, h, t, s = (metrics.get(k, {}) for k in ("greedy", "held_out", "generated", "sampled"))
    rows = [
        ("greedy exact match", "greedy.exact_match", "", _num(g.get("exact_match"))),
        ("greedy per-position match", "greedy.position_match", "", _num(g.get("position_match"))),
        ("mean first divergence (tokens)", "greedy.mean_first_divergence", "", _num(g.get("mean_first_divergence"))),
        ("held-out top-1 agreement", "held_out.top1_agreement", "", _num(h.get("top1_agreement"))),
        ("held-out KL(A||B) mean", "held_out.kl_mean", "", _num(h.get("kl_mean"))),
        ("held-out KL p99", "held_out.kl_p99", "", _num(h.get("kl_p99"))),
        ("held-out perplexity", "held_out.perplexity_increase", _num(h.get("perplexity_a")),
         f"{_num(h.get('perplexity_b'))} ({_num(h.get('perplexity_increase'), 3)})"),
        ("generated-text top-1 agreement", "generated.top1_agreement", "", _num(t.get("top1_agreement"))),
        ("generated-text KL mean", "generated.kl_mean", "", _num(t.get("kl_mean"))),
    ]
    if s:
        rows.append(("sampled two-sample p-value", "sampled.p_value", "", _num(s.get("p_value"), 3)))
    return rows


def cost_rows(cost: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(label, A, B) of the cost figures."""
    a, b = cost["a"], cost["b"]
    rows = [("tokens/s (greedy pass)", _num(a["tokens_per_second"]), _num(b["tokens_per_second"]))]
    for name, key in (("TTFT", "ttft_seconds"), ("TPOT", "tpot_seconds")):
        for q in ("p50", "p99"):
            rows.append((f"{name} {q}", _ms(a[key], q), _ms(b[key], q)))
    for name, key in (("weights", "weight_bytes"), ("KV pool", "kv_pool_bytes"), ("KV peak in use", "kv_peak_bytes")):
        rows.append((name, _mb(a[key]), _mb(b[key])))
    rows.append(("KV bytes per token", _num(a["kv_bytes_per_token"]), _num(b["kv_bytes_per_token"])))
    return rows


def _verdict_cell(verdict: Verdict | None) -> tuple[str, str]:
    if verdict is None:
        return "", ""
    mark = {True: "[green]pass[/]", False: "[bold red]FAIL[/]", None: "[yellow]not measured[/]"}[verdict.passed]
    return f"{verdict.op} {_num(verdict.bound)}", mark


def print_table(comparison: Comparison) -> None:
    """The side-by-side table on the terminal; MissingDependency without rich."""
    require("rich")
    from rich.console import Console
    from rich.table import Table

    by_metric = {v.metric: v for v in comparison.verdicts}
    table = Table(title=f"A: {describe_config(comparison.a)}\nB: {describe_config(comparison.b)}\n"
                  f"(B changes: {', '.join(comparison.kinds)})")
    for name in ("metric", "A", "B", "threshold", "verdict"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    for label, key, va, vb in quality_rows(comparison.metrics):
        table.add_row(label, va, vb, *_verdict_cell(by_metric.get(key)))
    table.add_section()
    for label, va, vb in cost_rows(comparison.metrics["cost"]):
        table.add_row(label, va, vb, "", "")
    console = Console()
    console.print(table)
    outcome = "[green]all verdicts pass[/]" if comparison.passed else (
        "[bold red]failed: " + ", ".join(v.threshold for v in comparison.failures()) + "[/]")
    console.print(outcome)
