"""The soak's report (scripts/soak.py): outcomes by kind, latency percentiles, and the end checks."""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np
from soak_traffic import Outcome

WELL_FORMED_ERRORS = ("busy", "timeout")  # a well-formed request's own errors: 503 queue bound, 504 its timeout
RSS_TOLERANCE = 0.05


def percentiles(values: Sequence[float]) -> dict | None:
    """p50/p90/p99/max in milliseconds, or None without values."""
    if not values:
        return None
    p50, p90, p99 = np.percentile(np.asarray(values) * 1000, [50, 90, 99])
    return {"p50_ms": round(p50, 1), "p90_ms": round(p90, 1), "p99_ms": round(p99, 1),
            "max_ms": round(max(values) * 1000, 1), "count": len(values)}


def outcome_summary(outcomes: list[Outcome]) -> dict:
    """Counts by result and by kind, latencies of complete answers, and the first few problems."""
    by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for o in outcomes:
        by_kind[o.kind][o.result] += 1
    ok = [o for o in outcomes if o.result == "ok"]
    streams = [o.ttft for o in ok if o.ttft is not None]
    problems = [f"{o.kind}: {o.result}: {o.detail}" for o in outcomes if o.result in ("lost", "unexpected")]
    return {
        "requests": len(outcomes),
        "results": dict(collections.Counter(o.result for o in outcomes)),
        "by_kind": {kind: dict(counts) for kind, counts in sorted(by_kind.items())},
        "latency": {"all_ok": percentiles([o.seconds for o in ok]), "stream_first_event": percentiles(streams),
                    **{kind: percentiles([o.seconds for o in ok if o.kind == kind]) for kind in sorted(by_kind)}},
        "problems": problems[:20],
    }


def checks(summary: dict, memory: dict, server: dict, greedy: dict, strict_compiles: bool) -> dict:
    """Each end check: passed, and what it measured. Compiles after the warm-up fail only when strict."""
    results = summary["results"]
    rss_growth = (memory["rss_end"] - memory["rss_baseline"]) / memory["rss_baseline"]
    device = memory.get("device_growth")
    found = {
        "nothing_lost": (results.get("lost", 0) == 0, f"lost {results.get('lost', 0)}"),
        "no_unexpected_answer": (results.get("unexpected", 0) == 0, f"unexpected {results.get('unexpected', 0)}"),
        "pages_returned": (server["kv_cache_usage_perc"] == 0 and server["running"] == 0 and server["waiting"] == 0,
                           f"kv usage {server['kv_cache_usage_perc']}, running {server['running']}, "
                           f"waiting {server['waiting']} (prefix-cached pages aside)"),
        "rss_within_5_percent": _rss_check(rss_growth, server["compiles_after_warmup"], strict_compiles),
        "greedy_equals_llm_generate": (greedy["mismatches"] == 0 and greedy["compared"] > 0,
                                       f"{greedy['compared']} compared, {greedy['mismatches']} differ"),
        "clean_exit_on_sigterm": (server["exit_code"] == 0, f"exit code {server['exit_code']}"),
        "no_compile_after_warmup": (server["compiles_after_warmup"] == 0 or not strict_compiles,
                                    f"{server['compiles_after_warmup']} programs compiled after the warm-up"
                                    + ("" if strict_compiles else " (reported; --strict-compiles fails on it)")),
    }
    if device is not None:
        found["device_memory_within_5_percent"] = (abs(device) <= RSS_TOLERANCE, f"{device:+.2%}")
    return {name: {"passed": bool(passed), "measured": measured} for name, (passed, measured) in found.items()}


def _rss_check(growth: float, compiles: float, strict_compiles: bool) -> tuple[bool, str]:
    """RSS growth past the baseline (shrinking is no leak). Each program compiled after the warm-up maps
    new code, so without --strict-compiles growth beside such compiles is reported, not failed."""
    if growth <= RSS_TOLERANCE:
        return True, f"{growth:+.2%}"
    if compiles and not strict_compiles:
        return True, f"{growth:+.2%}, not judged: {compiles:.0f} programs compiled after the warm-up"
    return False, f"{growth:+.2%}"
