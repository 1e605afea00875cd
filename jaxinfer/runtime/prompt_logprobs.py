"""Log-probabilities of a prompt's own tokens (vLLM's prompt_logprobs), via one all-positions pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.cache.contiguous import init_cache
from jaxinfer.config.buckets import bucket
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights
from jaxinfer.parallel.sharding import UNSHARDED, Layout, to_host
from jaxinfer.runtime import step_programs
from jaxinfer.sampling.logprob import Logprob, TokenText, no_text, position_logprobs

MIN_BUCKET = 16


def all_position_logits(
    weights: Weights, cfg: ModelConfig, ids: list[int], dtype: jnp.dtype, max_len: int, cpu_kernels: bool = False,
    layout: Layout = UNSHARDED,
) -> np.ndarray:
    """Float32 next-token logits [len(ids), V] at every position (lengths bucketed to powers of two
    up to max_len, so a new length rarely compiles). cpu_kernels: the weights are packed for them;
    layout: the mesh the weights are sharded over."""
    n = len(ids)
    size = min(bucket(n, MIN_BUCKET), max(max_len, n))
    tokens = np.zeros((1, size), np.int32)
    tokens[0, :n] = ids
    cache = init_cache(cfg, 1, size, dtype, cpu_kernels, layout)
    return to_host(step_programs.all_logits(weights, layout.put(tokens), cache, cfg=cfg))[0, :n]


def prompt_logprobs(
    weights: Weights, cfg: ModelConfig, ids: list[int], k: int, dtype: jnp.dtype, max_len: int,
    cpu_kernels: bool = False, layout: Layout = UNSHARDED, text: TokenText = no_text,
) -> list[dict[int, Logprob] | None]:
    """Per prompt token: None for the first, else its id and the top-k ids -> Logprob given the prefix."""
    logits = all_position_logits(weights, cfg, ids, dtype, max_len, cpu_kernels, layout)
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits[:-1]), axis=-1))
    out: list[dict[int, Logprob] | None] = [None]
    for i, row in enumerate(logp, start=1):
        top = np.argsort(-row, kind="stable")[:k].tolist() if k else []
        rank = 1 + int(np.count_nonzero(row > row[ids[i]]))
        out.append(position_logprobs(ids[i], row[ids[i]], rank, top, row[top], text))
    return out
