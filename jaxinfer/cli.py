"""`jaxinfer generate | convert`: the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence


def _generate(args: argparse.Namespace) -> int:
    from jaxinfer import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, max_seq_len=args.max_seq_len)
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
    )
    sys.stdout.write(args.prompt)
    for piece in llm.stream(args.prompt, params):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def _convert(args: argparse.Namespace) -> int:
    import jax.numpy as jnp

    from jaxinfer.checkpoint import load_hf_weights, save_converted
    from jaxinfer.config import load_config
    from jaxinfer.llm import DTYPES

    cfg = load_config(args.hf_dir)
    weights = load_hf_weights(args.hf_dir, cfg, DTYPES.get(args.dtype, jnp.float32))
    out = save_converted(weights, args.hf_dir, args.out_dir)
    print(f"wrote {out} ({cfg.architecture}, {cfg.num_layers} layers, {args.dtype})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(prog="jaxinfer", description="JAX inference for Llama-family models")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="stream a completion of --prompt to stdout")
    gen.add_argument("--model", default=None, help="HF or converted model directory (default: the demo model)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    gen.add_argument("--max-seq-len", type=int, default=None)
    gen.set_defaults(run=_generate)

    conv = sub.add_parser("convert", help="HF safetensors checkpoint -> orbax checkpoint directory")
    conv.add_argument("hf_dir", type=Path)
    conv.add_argument("out_dir", type=Path)
    conv.add_argument("--dtype", default="bfloat16", help="float32, bfloat16 or float16")
    conv.set_defaults(run=_convert)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `jaxinfer` command; bad input exits 2 with the reason on stderr."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"jaxinfer: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
