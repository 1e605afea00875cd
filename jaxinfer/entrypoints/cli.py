"""`jaxinfer generate | serve | convert | bench | compare`: the command line."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import NoReturn, Sequence

from jaxinfer import __version__
from jaxinfer.checkpoint.loader import CheckpointError
from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.model import ConfigError
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.config.validation import DTYPE_ALIASES, DTYPE_NAMES
from jaxinfer.entrypoints.cli_args import (
    WEIGHT_QUANTIZATIONS,
    add_distributed_args,
    add_memory_args,
    add_parallel_args,
    add_quantization_args,
    initialize_distributed,
)
from jaxinfer.entrypoints.compare.cli import add_compare_parser
from jaxinfer.entrypoints.openai.bench import add_bench_parser
from jaxinfer.entrypoints.openai.launch import add_serve_parser

# Any of these is bad input (or a bad model directory): one line on stderr and exit 2.
USER_ERRORS = (ValueError, TypeError, OverflowError, OSError, ConfigError, CheckpointError)
DEFAULTS = SamplingParams()  # the CLI's defaults are the API's (vLLM's): one set, documented once
DEBUG_ENV = "JAXINFER_DEBUG"  # set to 1 (or pass --debug) for the traceback of an unexpected error
# argparse's own wording for a value its type= rejected, and what each type accepts.
BAD_VALUE = re.compile(r"invalid (int|float) value: (.*)$")
ACCEPTED = {"int": "is not an integer (accepted: a whole number such as 16)",
            "float": "is not a number (accepted: a decimal number such as 0.7)"}


class CommandLineError(Exception):
    """Invalid command-line input, already worded as the one line to print."""


def explain(message: str) -> str:
    """argparse's error message, on one line and saying what the flag accepts where argparse does not."""
    message = " ".join(message.split())
    bad = BAD_VALUE.search(message)
    if bad:
        return message[: bad.start()] + f"{bad.group(2)} {ACCEPTED[bad.group(1)]}"
    if message.endswith("expected one argument"):
        return message + " (a value must follow the flag)"
    return message


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the flag and the value (subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        """Raise CommandLineError instead of printing the usage block and exiting."""
        raise CommandLineError(f"{self.prog}: error: {explain(message)}")


def _generate(args: argparse.Namespace) -> int:
    from jaxinfer import LLM
    from jaxinfer.checkpoint.kv_session import session_target
    from jaxinfer.config.validation import model_dir

    initialize_distributed(args)  # before anything touches the devices: every host runs this command
    # Checked before the model loads: a bad flag is reported at once, not after seconds of loading.
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
    )
    model = None if args.model is None else model_dir(args.model, "--model")  # the error names the flag
    adapter, rank = _adapter(args)
    if args.save_session is not None:  # a path it cannot save to fails now, not after the generation
        session_target(args.save_session, overwrite=False)
    llm = LLM(
        model, dtype=args.dtype, max_seq_len=args.max_seq_len,
        tensor_parallel_size=args.tp, data_parallel_size=args.dp, expert_parallel_size=args.ep,
        quantization=args.quantization, quantize_lm_head=args.quantize_lm_head, kv_cache_dtype=args.kv_cache_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization, enable_lora=adapter is not None,
        max_lora_rank=max(16, rank),
    )
    if adapter is not None:
        try:
            llm.engine.add_lora(adapter)
        except ValueError as error:
            raise ValueError(f"--lora-path {args.lora_path}: {error}") from None
    pieces = llm.stream(args.prompt, params, lora_request=adapter)
    pieces = (delta.outputs[0].text for delta in pieces if delta.outputs[0].text)
    first = next(pieces, "")  # validates and prefills before the prompt is echoed
    out = sys.stdout if _leads() else open(os.devnull, "w")  # every host decodes; process 0 prints
    out.write(args.prompt + first)
    out.flush()
    for piece in pieces:
        out.write(piece)
        out.flush()
    out.write("\n")
    if args.save_session is not None:
        info = llm.save_session(args.save_session, args.prompt)
        print(f"saved the KV of {info.num_cached_tokens} of the prompt's {len(info.token_ids)} tokens to {info.path}",
              file=sys.stderr)
    return 0


def _adapter(args: argparse.Namespace) -> tuple[LoRARequest | None, int]:
    """--lora-path as a LoRARequest and its rank, read before the model loads; (None, 0) without it."""
    from jaxinfer.checkpoint.lora_adapter import adapter_rank

    if args.lora_path is None:
        return None, 0
    if args.save_session is not None:
        raise ValueError("--save-session saves the base model's KV of --prompt; leave --lora-path out to save one")
    try:
        rank = adapter_rank(args.lora_path)
    except ValueError as error:
        raise ValueError(f"--lora-path {args.lora_path}: {error}") from None
    return LoRARequest("cli", 1, args.lora_path), rank


def _leads() -> bool:
    """True in process 0 (or a single process)."""
    import jax

    return jax.process_index() == 0


def _convert(args: argparse.Namespace) -> int:
    from jaxinfer.checkpoint.converted import check_out_dir, experts_quantization, save_converted, stored_dtype
    from jaxinfer.checkpoint.loader import load_hf_weights
    from jaxinfer.config.validation import dtype_name, model_dir
    from jaxinfer.entrypoints.model_loading import DTYPES, stored_experts_mode
    from jaxinfer.models import abstract_weights, leaf_quantizer
    from jaxinfer.models.registry import load_config
    from jaxinfer.parallel.sharding import UNSHARDED

    dtype = dtype_name(args.dtype, "--dtype", allow_auto=False)
    src = model_dir(args.hf_dir, "HF_DIR")
    if args.out_dir.resolve() == src.resolve():
        raise ValueError(f"OUT_DIR {args.out_dir} is HF_DIR itself; choose a different output directory")
    check_out_dir(args.out_dir, args.overwrite, "OUT_DIR", "--overwrite")  # before seconds of loading
    cfg = load_config(src)
    # Quantized as each leaf is read (one float leaf held at a time); MXFP4 experts stay MXFP4 unless asked otherwise.
    experts_mode = stored_experts_mode(src, cfg, UNSHARDED, args.quantize)
    transform = leaf_quantizer(abstract_weights(cfg), args.quantize, args.group_size, experts_mode=experts_mode)
    weights = load_hf_weights(src, cfg, DTYPES[dtype], transform=transform)
    out = save_converted(weights, src, args.out_dir, overwrite=args.overwrite)
    experts = experts_quantization(weights)
    quant = f", projections {args.quantize}" if args.quantize else ""
    quant += f", experts {experts['mode']}" if experts else ""
    print(f"wrote {out} ({cfg.architecture}, {cfg.num_layers} layers, {stored_dtype(weights, cfg)}{quant})")
    return 0


def _add_sampling_args(gen: argparse.ArgumentParser) -> None:
    """Sampling flags; their defaults are SamplingParams' own."""
    gen.add_argument("--max-tokens", type=int, default=DEFAULTS.max_tokens, help="tokens to generate (default: %(default)s)")
    gen.add_argument("--temperature", type=float, default=DEFAULTS.temperature, help="0 = greedy (default: %(default)s)")
    gen.add_argument("--top-k", type=int, default=DEFAULTS.top_k, help="0 = off (default: %(default)s)")
    gen.add_argument("--top-p", type=float, default=DEFAULTS.top_p, help="1.0 = off (default: %(default)s)")
    gen.add_argument("--min-p", type=float, default=DEFAULTS.min_p, help="0.0 = off (default: %(default)s)")
    gen.add_argument("--seed", type=int, default=DEFAULTS.seed, help="same seed, same output (default: random)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = OneLineParser(
        prog="jaxinfer", description="JAX inference for Llama, Mistral, Qwen, Gemma, Phi-3 and MoE models"
    )
    parser.add_argument("--version", action="version", version=f"jaxinfer {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help=f"show the traceback of an unexpected error (or set {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser(
        "generate", help="stream a completion of --prompt to stdout",
        description="Stream a completion of --prompt. Sampling defaults are SamplingParams' (vLLM's).",
    )
    gen.add_argument("--model", default=None, help="HF or converted model directory (default: the demo model)")
    gen.add_argument("--prompt", required=True, help="text to complete (echoed before the completion)")
    _add_sampling_args(gen)
    gen.add_argument("--dtype", default="auto", help="auto (the checkpoint's), float32, bfloat16 or float16 (default: %(default)s)")
    gen.add_argument("--max-seq-len", type=int, default=None, help="cache length (default: the model's, <= 2048)")
    gen.add_argument("--lora-path", default=None, metavar="DIR",
                     help="generate through this LoRA adapter (a PEFT directory) of the model")
    gen.add_argument("--save-session", default=None, metavar="DIR",
                     help="then save the KV of --prompt (its whole pages) to DIR, a new or empty directory, for "
                     "`jaxinfer serve --load-session DIR` with the same model, dtype and cache settings")
    add_parallel_args(gen)
    add_distributed_args(gen)
    add_quantization_args(gen)
    add_memory_args(gen)
    gen.set_defaults(run=_generate)
    add_serve_parser(sub)

    dtypes = ", ".join((*DTYPE_NAMES, *DTYPE_ALIASES))
    conv = sub.add_parser("convert", help="HF safetensors checkpoint -> orbax checkpoint directory")
    conv.add_argument("hf_dir", type=Path, metavar="HF_DIR", help="an HF safetensors checkpoint directory")
    conv.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="a new or empty directory (not HF_DIR)")
    conv.add_argument("--overwrite", action="store_true",
                      help="write into a non-empty OUT_DIR, replacing what a convert writes there (config, "
                      "tokenizer files, weights); other files stay")
    conv.add_argument("--dtype", default="bfloat16", help=f"dtype of the stored weights: {dtypes} (default: %(default)s)")
    conv.add_argument("--quantize", choices=WEIGHT_QUANTIZATIONS, default=None,
                      help="store the projections and routed experts quantized (embedding, head, norms and "
                           "routers keep --dtype)")
    conv.add_argument("--group-size", type=int, default=32, help="int4 rows per scale: 32, 64 or 128 (default: %(default)s)")
    conv.set_defaults(run=_convert)
    add_bench_parser(sub)
    add_compare_parser(sub)
    return parser


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parsed arguments; CommandLineError (one line) for anything argparse rejects."""
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:  # argparse names them, but not which subcommand's --help lists the accepted ones
        raise CommandLineError(
            f"jaxinfer {args.command}: error: unrecognized arguments: {' '.join(unknown)} "
            f"(`jaxinfer {args.command} --help` lists the accepted flags)"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `jaxinfer` command: bad input exits 2 and an unexpected error 1, each with one line on stderr."""
    try:
        args = parse(argv)
    except CommandLineError as err:
        print(err, file=sys.stderr)
        return 2
    try:
        return args.run(args)
    except USER_ERRORS as err:
        print(f"jaxinfer: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - a user sees one line; --debug shows the traceback
        if args.debug or os.environ.get(DEBUG_ENV, "0") not in ("", "0"):
            raise
        print(f"jaxinfer: internal error: {type(err).__name__}: {' '.join(str(err).split())} "
              f"(rerun as `jaxinfer --debug ...` or with {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
