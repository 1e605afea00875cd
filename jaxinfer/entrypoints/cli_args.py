"""Flags shared by `jaxinfer generate` and `jaxinfer serve`: the device mesh, multi-host, quantization and KV memory."""

from __future__ import annotations

import argparse
from typing import Any

from jaxinfer.config import validation

WEIGHT_QUANTIZATIONS = ("int8", "int4", "fp8")
KV_CACHE_DTYPES = ("auto", "int8", "fp8")


def add_parallel_args(parser: argparse.ArgumentParser) -> None:
    """--tp / --dp / --ep: the device mesh (LLM's tensor_, data_ and expert_parallel_size)."""
    parser.add_argument("--tp", "--tensor-parallel-size", "-tp", type=int, default=1,
                        help="tensor parallel: split heads, MLP and vocabulary over N devices (default: %(default)s)")
    parser.add_argument("--dp", "--data-parallel-size", "-dp", type=int, default=1,
                        help="data parallel: split the batch over N device groups (default: %(default)s)")
    parser.add_argument("--ep", type=int, default=1, help="expert parallel: split a mixture-of-experts model's experts "
                        "over N device groups, combinable with --tp (default: %(default)s)")


def add_memory_args(parser: argparse.ArgumentParser) -> None:
    """--gpu-memory-utilization (LLM's gpu_memory_utilization), checked at parse time, before the model loads."""
    parser.add_argument("--gpu-memory-utilization", type=memory_fraction, default=None, metavar="FRACTION",
                        help="share of a GPU's or TPU's memory (what JAX may allocate) for the weights, a step's "
                        "activations and the KV pool, which gets the rest (default: 0.9; CPU and --num-pages "
                        "size the pool without it)")


def memory_fraction(text: str) -> float:
    """A --gpu-memory-utilization value: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        message = f"{text!r} is not a number (accepted: a fraction in (0, 1] such as 0.9)"
        raise argparse.ArgumentTypeError(message) from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not in (0, 1] (accepted: a fraction such as 0.9)")
    return value


def add_distributed_args(parser: argparse.ArgumentParser) -> None:
    """--coordinator-address / --num-processes / --process-id / --distributed: one process per host, one mesh."""
    group = parser.add_argument_group(
        "multi-host", "run the same command on every host; the processes join one mesh (jax.distributed)")
    group.add_argument("--coordinator-address", default=None, metavar="HOST:PORT",
                       help="process 0's address, the same on every process "
                       "(default: a single process, or detected with --distributed)")
    group.add_argument("--num-processes", type=int, default=None, help="processes in the run, one per host")
    group.add_argument("--process-id", type=int, default=None, help="this process's index, 0 .. num-processes - 1")
    group.add_argument("--distributed", action="store_true",
                       help="join even without the flags above: jax.distributed detects what is not given "
                       "(Cloud TPU VM slices, SLURM, JAX_COORDINATOR_ADDRESS)")


def distributed_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """The `jaxinfer.parallel.distributed.initialize` arguments the flags ask for (None: a single process), checked."""
    address, count, index = args.coordinator_address, args.num_processes, args.process_id
    if not args.distributed and (address, count, index) == (None, None, None):
        return None
    if address is not None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--coordinator-address {address!r} is not HOST:PORT with a port in 1..65535")
    validation.optional_int(count, "--num-processes", 1)
    validation.optional_int(index, "--process-id", 0, None if count is None else count - 1)
    return dict(coordinator_address=address, num_processes=count, process_id=index)


def initialize_distributed(args: argparse.Namespace) -> None:
    """Join the other processes when the flags ask for it; call before the model loads."""
    settings = distributed_settings(args)
    if settings is not None:
        from jaxinfer.parallel import distributed

        distributed.initialize(**settings)


def add_quantization_args(parser: argparse.ArgumentParser) -> None:
    """--quantization / --quantize-lm-head / --kv-cache-dtype (LLM's quantization / quantize_lm_head /
    kv_cache_dtype)."""
    parser.add_argument("--quantization", choices=WEIGHT_QUANTIZATIONS, default=None,
                        help="quantize the projection weights at load: int8 per column, int4 per group of 32 rows, "
                        "fp8 e4m3 per column (default: as stored; a `convert --quantize` checkpoint stays quantized)")
    parser.add_argument("--quantize-lm-head", action="store_true",
                        help="quantize the output head too, as --quantization does the projections (small models "
                        "with large vocabularies read the head for a fifth or more of each decode step)")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                        help="KV-cache storage: auto (the model's dtype), int8 or fp8 with per-token scales, "
                        "about half the bytes (default: %(default)s)")
