"""Per-step cost of structured output: 64 decoding rows of the demo model with 0, 8 and 64 of them
under a 30-field JSON schema; the host's mask time and the whole step's time.

Every configuration decodes one token per call (decode_steps=1: a constrained row takes one token
per call anyway), so the difference is the masks' cost (host filling + device applying), not the
multi-step loop; the unconstrained batch with the default multi-step calls is timed too, per token.
Configurations are interleaved over rounds; the median and 10th-percentile step are reported (the
machine is shared), with the host's mask time per step and the device's mask application timed alone.

    python scripts/bench_structured.py [--rows 64] [--steps 40] [--rounds 3] [--out results/bench_structured.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from compare_grammar_libraries import thirty_field_schema  # noqa: E402

from jaxinfer import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402

PROMPTS = ["def main():\n", "import json\n", "class Config:\n", "# settings\n"]
MAX_SEQ_LEN = 512


def params_for(rows: int, constrained: int) -> list[SamplingParams]:
    """`constrained` rows under the schema, the rest free; all sampled (temperature 1) and long enough
    that no row finishes inside the timed steps."""
    schema = StructuredOutputsParams(json=thirty_field_schema())
    return [SamplingParams(max_tokens=400, temperature=1.0, seed=i, ignore_eos=True,
                           structured_outputs=schema if i < constrained else None) for i in range(rows)]


def timed_steps(llm: LLM, params: list[SamplingParams], steps: int, tag: str) -> dict:
    """Per-step seconds of `steps` all-decode engine steps after every row's prefill, and the host's mask time."""
    engine = llm.engine
    for i, p in enumerate(params):
        engine.add_request(f"{tag}-{i}", PROMPTS[i % len(PROMPTS)], p)
    scheduler = engine.scheduler
    while scheduler.waiting or any(r.prefilling for r in scheduler.running):
        engine.step()
    before_rows, before_mask = engine.structured.mask_rows, engine.structured.mask_seconds
    seconds, tokens = [], 0
    for _ in range(steps):
        started = time.perf_counter()
        outputs = engine.step()
        seconds.append(time.perf_counter() - started)
        tokens += sum(len(c.token_ids) for o in outputs for c in o.outputs)
    live = len(scheduler.running)
    for request_id in list(engine.groups):
        engine.abort(request_id)
    while engine.has_unfinished():
        engine.step()
    masks = engine.structured.mask_rows - before_rows
    return {"step_seconds": seconds, "tokens_per_step": tokens / steps, "rows_at_end": live,
            "mask_s_per_step": (engine.structured.mask_seconds - before_mask) / steps,
            "mask_us_per_row": 1e6 * (engine.structured.mask_seconds - before_mask) / max(masks, 1)}


def device_apply_seconds(rows: int, vocab: int, repeats: int = 200) -> float:
    """Median seconds of the device's mask application alone at [rows, vocab] (every step pays it)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxinfer.sampling.token_bitmask import all_allowed, apply_token_bitmask

    apply = jax.jit(apply_token_bitmask)
    logits, mask = jnp.zeros((rows, vocab), jnp.float32), jnp.asarray(all_allowed(rows, vocab))
    apply(logits, mask).block_until_ready()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        apply(logits, mask).block_until_ready()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def summarize(results: list[dict], rows: int) -> dict:
    """Step time (median and 10th percentile over every timed step of every round; the machine is shared,
    so the low percentile is the less disturbed figure) and the host's mask time."""
    steps = sorted(s for r in results for s in r["step_seconds"])
    per_step_tokens = statistics.fmean(r["tokens_per_step"] for r in results)
    iterations = per_step_tokens / rows  # decode iterations per call (a multi-step call runs several)
    median, p10 = steps[len(steps) // 2], steps[len(steps) // 10]
    return {"step_median_s": median, "step_p10_s": p10,
            "iteration_median_s": median / iterations, "iteration_p10_s": p10 / iterations,
            "mask_s_per_step": statistics.fmean(r["mask_s_per_step"] for r in results),
            "mask_us_per_row": statistics.fmean(r["mask_us_per_row"] for r in results),
            "tokens_per_step": per_step_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "results" / "bench_structured.json"))
    args = parser.parse_args()
    knobs = dict(max_seq_len=MAX_SEQ_LEN, max_num_seqs=args.rows, num_pages=args.rows * MAX_SEQ_LEN // 16 + 64)
    llms = {1: LLM(**knobs, decode_steps=1), 8: LLM(**knobs, decode_steps=8)}
    configs = [(1, 0), (1, 8), (1, args.rows), (8, 0)]
    runs: dict[str, list[dict]] = {}
    for round_index in range(args.rounds + 1):  # round 0 compiles the shapes and is not kept
        for decode_steps, constrained in configs:
            key = f"decode_steps={decode_steps} constrained={constrained}"
            result = timed_steps(llms[decode_steps], params_for(args.rows, constrained), args.steps, f"r{round_index}")
            if round_index:
                runs.setdefault(key, []).append(result)
            print(round_index, key, json.dumps({k: v for k, v in result.items() if k != "step_seconds"}), flush=True)
    summary = {key: summarize(results, args.rows) for key, results in runs.items()}
    base = summary["decode_steps=1 constrained=0"]
    for values in summary.values():
        for stat in ("median", "p10"):
            values[f"overhead_{stat}"] = values[f"iteration_{stat}_s"] / base[f"iteration_{stat}_s"] - 1
        values["mask_share_of_free_step"] = values["mask_s_per_step"] / base["step_median_s"]
    apply_s = device_apply_seconds(args.rows, llms[1].config.vocab_size)
    report = {"rows": args.rows, "steps": args.steps, "rounds": args.rounds, "device_apply_s": apply_s,
              "summary": summary, "runs": runs}
    print(json.dumps({"device_apply_s": apply_s, **summary}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
