"""What choosing a token costs a decode step: the engine's sampling work per step, by batch size.

A GPU's step programs are branchless (no `lax.cond`: XLA:GPU reads a conditional's predicate back
on the host), so every decode step of every row does all the work any row might ask for: logit
bias, penalties, min_tokens, the structured-output mask, top-k/top-p (a sort of each row),
temperature and min-p, the draw, and the top-20 logprobs. This times that work (`branchless`,
`engine_step.pick_tokens` and `row_logprobs` exactly as the decode program runs them) for an
all-greedy batch, against what a program for all-greedy, plain rows would need (`argmax`); the
same for a verify round of k = 4 prompt-lookup drafts a row (`verify_branchless`: the target's
processed distribution at every position and the exact acceptance, as `verify_step` runs them,
against `verify_argmax`, and `verify_with_conds`, the same with the conditionals a CPU or TPU
program keeps); and the orderings `sampling/row_order` replaced: a float sort against
the int32-key sort, `top_k(20)` against top-16 parts. Each stage runs `--passes` times inside
one device call (a fixed-trip loop), so the figure is device time, not dispatch. Each is also
shown as a share of a decode step whose weights (`--weight-gb`, default the Llama-3.2-1B
shape's bf16 2.47 GB) stream at the copy bandwidth measured in the same run. Writes JSON.

    python scripts/bench_sampling.py --rows 1 8 64            # Llama-3 vocabulary (128256)
    python scripts/bench_sampling.py --rows 1 64 --vocab 49152 --passes 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_decode import measure_copy_bandwidth  # noqa: E402

from jaxinfer import SamplingParams  # noqa: E402
from jaxinfer.config.sampling_params import MAX_STOP_IDS  # noqa: E402
from jaxinfer.runtime.device_inputs import row_penalties  # noqa: E402
from jaxinfer.runtime.engine_step import MAX_LOGPROBS, RowSampling, pick_tokens, row_logprobs  # noqa: E402
from jaxinfer.runtime.row_slots import bias_row  # noqa: E402
from jaxinfer.sampling.penalties import PenaltyCounts  # noqa: E402
from jaxinfer.sampling.row_order import sorted_descending, top_k_in_parts  # noqa: E402
from jaxinfer.sampling.sampler import first_argmax, sampling_arrays  # noqa: E402
from jaxinfer.sampling.token_bitmask import all_allowed  # noqa: E402
from jaxinfer.speculative.rejection import verify_logits  # noqa: E402


def greedy_rows(rows: int, vocab: int) -> tuple[RowSampling, PenaltyCounts]:
    """A branchless decode step's sampling inputs for `rows` greedy rows without options, as the
    runner builds them (slot 0: no penalties kept), and the penalty counts of the slots."""
    params = [SamplingParams(temperature=0.0)] * rows
    ids, bias = bias_row(None)
    sampling = RowSampling(
        params=sampling_arrays(params, list(range(rows)), branchless=True),
        stop_ids=np.full((rows, MAX_STOP_IDS), -1, np.int32), min_lengths=np.zeros(rows, np.int32),
        max_lengths=np.full(rows, 1 << 30, np.int32), bias_ids=np.tile(ids, (rows, 1)), bias=np.tile(bias, (rows, 1)),
        penalties=row_penalties(params, np.zeros(rows, np.int32)), samples=np.ones(rows, bool),
        want_logprobs=np.zeros(rows, bool), bitmask=all_allowed(rows, vocab),
    )
    counts = PenaltyCounts(np.zeros((rows + 1, vocab), np.int32), np.zeros((rows + 1, vocab), bool))
    return jax.device_put(sampling), jax.device_put(counts)


Stage = Callable[[jax.Array, tuple], jax.Array]
VERIFY_CHUNK = 5  # a verify round's positions per row: the last token and k = 4 drafts


def verify_greedy(logits: jax.Array, drafts: jax.Array) -> jax.Array:
    """What an all-greedy verify round needs: each position's argmax, the drafts kept while they agree."""
    rows = drafts.shape[0]
    best = first_argmax(logits).reshape(rows, VERIFY_CHUNK)
    accepted = jnp.sum(jnp.cumprod(best[:, :-1] == drafts, axis=-1), axis=-1)
    return accepted + best[jnp.arange(rows), accepted]


def stages(rows: int, vocab: int) -> tuple[dict[str, tuple[int, Stage]], tuple]:
    """Each timed stage as (positions per row, (logits [rows * positions, vocab], inputs) -> an array
    that depends on all of its work), and the inputs: the rows' sampling state and a verify round's
    drafts, passed as arguments (as constants XLA would fold the greedy rows' choice and drop the
    work a branchless program does for them)."""
    sampling, counts = greedy_rows(rows, vocab)

    def branchless(logits: jax.Array, inputs: tuple) -> jax.Array:
        sampling, counts, lengths, _ = inputs
        tokens = pick_tokens(logits, sampling, lengths, counts)
        chosen, top_ids, top_values, ranks = row_logprobs(logits, tokens, sampling)
        return tokens + top_ids[:, 0] + ranks + (chosen + top_values[:, 0] > 0)

    def verify_round(logits: jax.Array, inputs: tuple, branchless: bool = True) -> jax.Array:
        """A verify round's acceptance as `verify_step` runs it for prompt-lookup drafts (one-hot q);
        branchless=False: with the conditionals a CPU or TPU program keeps."""
        sampling, _, lengths, drafts = inputs
        params = dataclasses.replace(sampling.params, branchless=branchless)
        count = jnp.full((rows,), VERIFY_CHUNK - 1, jnp.int32)
        verdict = verify_logits(logits.reshape(rows, VERIFY_CHUNK, vocab), None, drafts, count, params, lengths)
        return verdict.num_accepted + verdict.next_token

    return {
        "branchless": (1, branchless),
        "argmax": (1, lambda logits, _: first_argmax(logits)),
        "verify_branchless": (VERIFY_CHUNK, verify_round),
        "verify_with_conds": (VERIFY_CHUNK, lambda logits, inputs: verify_round(logits, inputs, branchless=False)),
        "verify_argmax": (VERIFY_CHUNK, lambda logits, inputs: verify_greedy(logits, inputs[3])),
        "sort_float": (1, lambda logits, _: jnp.sort(logits, axis=-1)[:, -1]),
        "sort_int_keys": (1, lambda logits, _: sorted_descending(logits)[:, 0]),
        "top_k_20": (1, lambda logits, _: jax.lax.top_k(logits, MAX_LOGPROBS)[1][:, -1]),
        "top_k_16_parts": (1, lambda logits, _: top_k_in_parts(logits, MAX_LOGPROBS)[1][:, -1]),
    }, (sampling, counts, jnp.ones((rows,), jnp.int32), jnp.zeros((rows, VERIFY_CHUNK - 1), jnp.int32))


def device_ms(stage: Stage, logits: jax.Array, inputs: tuple, passes: int, repeats: int) -> float:
    """Median milliseconds per pass of `stage`, run `passes` times in one call; each pass's logits
    carry one entry of the last pass's result, so no pass can be hoisted or skipped."""
    def body(_, carry: tuple[jax.Array, jax.Array, tuple]) -> tuple[jax.Array, jax.Array, tuple]:
        x, total, inputs = carry
        out = stage(x, inputs).astype(jnp.float32)
        return x.at[0, 0].set(out[0] * 1e-30), total + jnp.sum(out), inputs

    run = jax.jit(lambda x, inputs: jax.lax.fori_loop(0, passes, body, (x, jnp.float32(0), inputs))[1])
    run(logits, inputs).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(logits, inputs).block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3 / passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--vocab", type=int, default=128256, help="the Llama-3 vocabulary by default")
    parser.add_argument("--passes", type=int, default=8, help="stage runs per device call (the decode loop's 8)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--weight-gb", type=float, default=2.47, help="weights a decode step streams, GB")
    parser.add_argument("--probe-mb", type=int, default=1024, help="buffer size of the copy-bandwidth probe")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    bandwidth = measure_copy_bandwidth(args.probe_mb << 20)
    step_ms = args.weight_gb * 1e9 / bandwidth * 1e3
    device = jax.devices()[0]
    print(f"{device.device_kind} ({jax.default_backend()}), jax {jax.__version__}; copy bandwidth "
          f"{bandwidth / 1e9:.0f} GB/s: a decode step streaming {args.weight_gb} GB takes {step_ms:.3f} ms; "
          f"vocabulary {args.vocab}")
    print(f"{'rows':>5} {'stage':<16} {'ms/step':>9} {'of a step':>9}")
    results = []
    for rows in args.rows:
        timed, inputs = stages(rows, args.vocab)
        for name, (positions, stage) in timed.items():
            logits = jax.random.normal(jax.random.PRNGKey(rows), (rows * positions, args.vocab), jnp.float32)
            ms = device_ms(stage, logits, inputs, args.passes, args.repeats)
            results.append(dict(rows=rows, stage=name, ms=ms, share_of_step=ms / step_ms))
            print(f"{rows:>5} {name:<16} {ms:>9.3f} {ms / step_ms:>8.1%}", flush=True)
    out = args.out or Path("results") / f"bench_sampling_{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = dict(device=device.device_kind, platform=jax.default_backend(), jax=jax.__version__, vocab=args.vocab,
                  copy_bandwidth=bandwidth, step_ms=step_ms, rows=results)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
