"""Every metric of a comparison from the two sides' runs: quality of B against A, and each side's cost."""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxinfer.entrypoints.compare.quality import concat, greedy_agreement, teacher_forced
from jaxinfer.entrypoints.compare.runs import Cost, Run
from jaxinfer.entrypoints.compare.two_sample import permutation_chi_square


def latency_summary(values: list[float]) -> dict[str, float | None]:
    """Mean, p50 and p99 in seconds (None when nothing was measured)."""
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    arr = np.asarray(values)
    return {"mean": float(arr.mean()), "p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99))}


def cost_summary(cost: Cost) -> dict[str, Any]:
    """One side's cost figures as the report shows them."""
    return {
        "tokens_per_second": cost.tokens_per_second, "generated_tokens": cost.generated_tokens,
        "seconds": cost.seconds, "ttft_seconds": latency_summary(cost.ttft), "tpot_seconds": latency_summary(cost.tpot),
        "weight_bytes": cost.weight_bytes, "kv_pool_bytes": cost.kv_pool_bytes, "kv_peak_bytes": cost.kv_peak_bytes,
        "kv_bytes_per_token": cost.kv_bytes_per_token, "includes_compilation": cost.includes_compilation,
    }


def check_same_tokens(a: Run, b: Run) -> None:
    """Both sides must read the same token ids: the metrics compare distributions over one vocabulary."""
    if a.prompt_ids != b.prompt_ids:
        raise ValueError("A and B tokenize the prompts differently; compare needs both to share one tokenizer")
    widths = {lp.shape[1] for lp in a.logprobs + b.logprobs}
    if len(widths) > 1:
        raise ValueError(f"A and B have different vocabulary sizes {sorted(widths)}; compare needs one vocabulary")


def score(a: Run, b: Run, seed: int = 0) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """(metrics by group, series for the plots): greedy, held-out, generated text, sampled, cost."""
    check_same_tokens(a, b)
    greedy = greedy_agreement(a.greedy, b.greedy)
    parts = [teacher_forced(la, lb, ids) for la, lb, ids in zip(a.logprobs, b.logprobs, a.forced_texts)]
    held, generated = concat(parts[: a.held_out_count]), concat(parts[a.held_out_count :])
    metrics: dict[str, dict[str, Any]] = {
        "greedy": {"prompts": len(a.greedy), "exact_match": greedy.exact_match, "position_match": greedy.position_match,
                   "mean_first_divergence": float(np.mean(greedy.first_divergence))},
        "held_out": held.summary(),
        "generated": generated.summary(),
    }
    if a.sampled and b.sampled:
        test = permutation_chi_square(a.sampled, b.sampled, seed=seed)
        metrics["sampled"] = {"p_value": test.p_value, "statistic": test.statistic, "prompts": test.prompts,
                              "samples_per_prompt": test.samples_a, "positions": test.positions}
    metrics["cost"] = {"a": cost_summary(a.cost), "b": cost_summary(b.cost)}
    series = {
        "agreement_by_position": greedy.agreement_by_position,
        "first_divergence": greedy.first_divergence,
        "kl_held_out": held.kl.tolist(),
        "kl_generated": generated.kl.tolist(),
        "ttft": {"a": a.cost.ttft, "b": b.cost.ttft},
        "tpot": {"a": a.cost.tpot, "b": b.cost.tpot},
    }
    return metrics, series
