"""Embeddings of whole prompts (vLLM's `LLM.embed`, the server's /v1/embeddings): one pass over the
prompt, its final hidden states pooled on the device, L2-normalized on the host.

Prompts pad to the prompt-logprobs buckets (`prompt_logprobs.prompt_bucket`); each pooling type
is its own program per bucket, compiled on its first use (an engine that serves embeddings pays
that once per bucket, not per prompt).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxinfer.cache.contiguous import init_cache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights
from jaxinfer.parallel.sharding import UNSHARDED, Layout, to_host
from jaxinfer.runtime import step_programs
from jaxinfer.runtime.executables import Program
from jaxinfer.runtime.prompt_logprobs import prompt_bucket, run_jitted

POOLING = ("last", "mean", "cls")  # vLLM's LAST, MEAN and CLS pooling types


def check_pooling(pooling: str) -> str:
    """The pooling type in lower case; a ValueError naming it when it is not one of POOLING."""
    name = pooling.lower() if isinstance(pooling, str) else pooling
    if name not in POOLING:
        raise ValueError(f"pooling must be one of {', '.join(POOLING)}, got {pooling!r}")
    return name


def pooled_program(
    weights: Weights, cfg: ModelConfig, size: int, dtype: jnp.dtype, pooling: str, cpu_kernels: bool = False,
    layout: Layout = UNSHARDED,
) -> Program:
    """The pooled pass over `size` tokens (zeros, length 1: filled in by `embedding`)."""
    cache = init_cache(cfg, 1, size, dtype, cpu_kernels, layout)
    tokens = layout.put(np.zeros((1, size), np.int32))
    return Program(step_programs.pooled_hidden, [weights, tokens, np.int32(1), cache],
                   dict(cfg=cfg, pooling=pooling), fixed=1)


def embedding(
    weights: Weights, cfg: ModelConfig, ids: list[int], dtype: jnp.dtype, max_len: int, pooling: str = "last",
    normalize: bool = True, cpu_kernels: bool = False, layout: Layout = UNSHARDED,
    run: Callable[[Program], Any] = run_jitted,
) -> np.ndarray:
    """Float32 [hidden size]: the prompt's pooled final hidden states, unit length when `normalize`."""
    size = prompt_bucket(len(ids), max_len)
    program = pooled_program(weights, cfg, size, dtype, pooling, cpu_kernels, layout)
    tokens = np.zeros((1, size), np.int32)
    tokens[0, : len(ids)] = ids
    program.args[1], program.args[2] = layout.put(tokens), np.int32(len(ids))
    vector = np.asarray(to_host(run(program)), np.float32)
    if normalize:
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    return vector
