"""Flags shared by `jaxinfer generate` and `jaxinfer serve`: the device mesh and quantization."""

from __future__ import annotations

import argparse

WEIGHT_QUANTIZATIONS = ("int8", "int4", "fp8")
KV_CACHE_DTYPES = ("auto", "int8", "fp8")


def add_parallel_args(parser: argparse.ArgumentParser) -> None:
    """--tp / --dp: the device mesh (LLM's tensor_parallel_size / data_parallel_size)."""
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel: split heads, MLP and vocabulary over N devices (default: %(default)s)")
    parser.add_argument("--dp", type=int, default=1, help="data parallel: split the batch over N device groups (default: %(default)s)")


def add_quantization_args(parser: argparse.ArgumentParser) -> None:
    """--quantization / --kv-cache-dtype (LLM's quantization / kv_cache_dtype)."""
    parser.add_argument("--quantization", choices=WEIGHT_QUANTIZATIONS, default=None,
                        help="quantize the projection weights at load: int8 per column, int4 per group of 32 rows, "
                        "fp8 e4m3 per column (default: as stored; a `convert --quantize` checkpoint stays quantized)")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                        help="KV-cache storage: auto (the model's dtype), int8 or fp8 with per-token scales, "
                        "about half the bytes (default: %(default)s)")
