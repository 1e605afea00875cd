"""Beam search speed: `LLM.beam_search` against HF transformers' `generate(num_beams=...)`, one run.

Both search B prompts of P random tokens with beam width W for N new tokens, every beam run to N
(ignore_eos; HF without an EOS id), on the same weights in float32. Also the engine's plain greedy
`generate` of B x W requests of the same lengths: the tokens a beam search computes, without its
bookkeeping and its one-token requests (the floor beam search approaches). Each figure is the
median of `--repeats` timed calls after an untimed one. Prints a table with the ratios and the
share of the top beams equal to HF's; writes JSON under results/.

    python scripts/bench_beam_search.py                    # the demo target, B 1 and 4, W 4
    python scripts/bench_beam_search.py --batch 8 --width 2 --new-tokens 64
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import transformers
from bench_decode import median_time

from jaxinfer import LLM, BeamSearchParams, SamplingParams
from jaxinfer.entrypoints.llm import DEMO_MODEL

RESULTS = Path(__file__).parents[1] / "results"


def hf_beams(model: torch.nn.Module, prompts: list[list[int]], width: int, new_tokens: int) -> list[list[int]]:
    """HF's best beam per prompt (equal-length prompts, one batch)."""
    with torch.no_grad():
        out = model.generate(torch.tensor(prompts), num_beams=width, do_sample=False, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=0)
    return out[:, len(prompts[0]):].tolist()


def run(llm: LLM, hf: torch.nn.Module, batch: int, width: int, prompt_len: int, new_tokens: int,
        repeats: int) -> dict:
    rng = np.random.default_rng(batch)
    prompts = rng.integers(3, llm.config.vocab_size, (batch, prompt_len)).tolist()
    params = BeamSearchParams(beam_width=width, max_tokens=new_tokens, ignore_eos=True)
    ours = median_time(lambda: llm.beam_search(prompts, params), repeats)
    plain_params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    plain = median_time(lambda: llm.generate([p for p in prompts for _ in range(width)], plain_params), repeats)
    theirs = median_time(lambda: hf_beams(hf, prompts, width, new_tokens), repeats)
    best = [out.sequences[0].tokens[prompt_len:] for out in llm.beam_search(prompts, params)]
    same = np.mean([a == b for a, b in zip(best, hf_beams(hf, prompts, width, new_tokens))])
    return {"batch": batch, "width": width, "prompt_len": prompt_len, "new_tokens": new_tokens,
            "beam_search_s": ours, "plain_rows_s": plain, "hf_beam_search_s": theirs,
            "vs_hf": theirs / ours, "vs_plain_rows": plain / ours, "top_beam_equal_to_hf": float(same)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEMO_MODEL)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    llm = LLM(args.model, dtype="float32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # every beam to max_new_tokens, as ignore_eos
    rows = [run(llm, hf, b, args.width, args.prompt_len, args.new_tokens, args.repeats) for b in args.batch]
    print(f"{'batch':>5} {'width':>5} {'ours s':>8} {'plain rows s':>12} {'HF s':>8} {'vs HF':>7} "
          f"{'vs plain':>8} {'top = HF':>8}")
    for r in rows:
        print(f"{r['batch']:>5} {r['width']:>5} {r['beam_search_s']:>8.3f} {r['plain_rows_s']:>12.3f} "
              f"{r['hf_beam_search_s']:>8.3f} {r['vs_hf']:>6.2f}x {r['vs_plain_rows']:>7.2f}x "
              f"{r['top_beam_equal_to_hf']:>8.2f}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "beam_search.json"
    out.write_text(json.dumps({"model": str(args.model), "torch_threads": torch.get_num_threads(), "rows": rows},
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
