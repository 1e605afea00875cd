"""How many programs an engine compiles for given knobs, per model shape (no model is loaded).

The count depends on the engine knobs and on max_seq_len (default: the model's, at most 2048):
step programs (`step_builder.program_shapes`), the sampling-slot reset, one all-positions pass per
prompt-logprobs length bucket. Writes JSON.

    python scripts/count_programs.py                         # demo, SmolLM-135M and Llama-3.2-1B shapes
    python scripts/count_programs.py --max-num-seqs 128 --speculative-tokens 4
    python scripts/count_programs.py --speculative-tokens 4 --draft-on-device   # a draft model or EAGLE head
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jaxinfer.config.engine import EngineConfig
from jaxinfer.engine.step_builder import program_shapes
from jaxinfer.entrypoints.llm import DEMO_MODEL
from jaxinfer.runtime.prompt_logprobs import prompt_buckets

CONFIGS = Path(__file__).parents[1] / "configs"
MODELS = {"demo": DEMO_MODEL / "config.json", "smollm-135m": CONFIGS / "smollm-135m.json",
          "llama-3.2-1b": CONFIGS / "llama-3.2-1b.json"}


def count(config: EngineConfig, verify_chunk: int | None, draft_on_device: bool = False) -> dict:
    """Programs by kind for one engine."""
    kinds: dict[str, int] = {}
    for kind, _, _ in program_shapes(config, verify_chunk, draft_on_device):
        kinds[kind] = kinds.get(kind, 0) + 1
    kinds["penalty_reset"] = 1
    kinds["prompt_logprobs"] = len(prompt_buckets(config.max_seq_len))
    return dict(max_seq_len=config.max_seq_len, total=sum(kinds.values()), by_kind=kinds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--speculative-tokens", type=int, default=0, help="k of an engine that speculates (0: none)")
    parser.add_argument("--draft-on-device", action="store_true",
                        help="it drafts with a draft model or EAGLE head (ragged steps also without its reads)")
    parser.add_argument("--out", type=Path, default=Path("results/count_programs.json"))
    args = parser.parse_args()
    rows = {}
    for name, path in MODELS.items():
        limit = json.loads(path.read_text())["max_position_embeddings"]
        config = EngineConfig(max_seq_len=min(limit, 2048), max_num_seqs=args.max_num_seqs,
                              max_num_batched_tokens=args.max_num_batched_tokens, decode_steps=args.decode_steps)
        rows[name] = count(config, args.speculative_tokens + 1 if args.speculative_tokens else None,
                           args.draft_on_device and args.speculative_tokens > 0)
        print(f"{name:<14} max_seq_len {rows[name]['max_seq_len']:>5}: {rows[name]['total']:>3} programs {rows[name]['by_kind']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(args={k: str(v) for k, v in vars(args).items()}, models=rows), indent=2))


if __name__ == "__main__":
    main()
