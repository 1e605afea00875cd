"""Log-probabilities of a prompt's own tokens (vLLM's prompt_logprobs), via one all-positions pass.

Prompt lengths pad to powers of four from MIN_BUCKET up to max_seq_len (4 programs at 2048),
all compiled by the engine's warm-up: a scoring request compiles nothing, at up to 4x the
compute of its prompt (powers of two would double the programs for half the padding).
A vision-language model's passes always take its image rows (`ImageRows`: all-text zeros for a
prompt without images), as its ragged steps do, so images add no program.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxinfer.cache.contiguous import init_cache
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights
from jaxinfer.models.embed_override import stacked_override
from jaxinfer.parallel.sharding import UNSHARDED, Layout, to_host
from jaxinfer.runtime import step_programs
from jaxinfer.runtime.executables import Program
from jaxinfer.sampling.logprob import Logprob, TokenText, no_text, position_logprobs

MIN_BUCKET = 64
# A prompt's image rows for the pass: ([n, D] float32 rows (Qwen3-VL's: [n, (1 + K) * D], DeepStack's beside),
# [n] bool where they replace the embeddings, [n, 3] int32 rotary offsets of an M-RoPE model's tokens or None)
ImageRows = tuple[np.ndarray, np.ndarray, np.ndarray | None]


def prompt_buckets(max_len: int) -> list[int]:
    """Every padded prompt length up to max_len: MIN_BUCKET, 4x that, ..., then max_len itself."""
    sizes, n = [], MIN_BUCKET
    while n < max_len:
        sizes.append(n)
        n *= 4
    return sizes + [max_len]


def prompt_bucket(n: int, max_len: int) -> int:
    """The padded length of an n-token prompt (n itself past max_len: `logits` of a longer sequence)."""
    return next((size for size in prompt_buckets(max_len) if size >= n), n)


def logits_program(
    weights: Weights, cfg: ModelConfig, size: int, dtype: jnp.dtype, cpu_kernels: bool = False,
    layout: Layout = UNSHARDED, rows: ImageRows | None = None,
) -> Program:
    """The all-positions pass over `size` tokens (zeros: warm-up compiles it); rows: a vision-language model's
    image rows over the first tokens (padded to `size` here)."""
    cache = init_cache(cfg, 1, size, dtype, cpu_kernels, layout)
    tokens = layout.put(np.zeros((1, size), np.int32))
    images = {}
    if rows is not None:
        padded = np.zeros((size, rows[0].shape[1]), np.float32), np.zeros(size, bool)
        padded[0][: len(rows[0])], padded[1][: len(rows[1])] = rows[:2]
        images = dict(override=layout.put_tree(stacked_override(*padded, cfg.hidden_size)))
        if rows[2] is not None:  # M-RoPE: the image tokens' grid offsets, the images' deltas after them
            offsets = np.zeros((1, size, 3), np.int32)
            offsets[0, : len(rows[2])] = rows[2]
            images["rope_offsets"] = layout.put(offsets)
    return Program(step_programs.all_logits, [weights, tokens, cache], dict(cfg=cfg, **images), fixed=1)


def run_jitted(program: Program) -> Any:
    """Call a program through jit (a runner calls its own through its table: runtime/executables)."""
    return program.function(*program.args, **program.kwargs)


def all_position_logits(
    weights: Weights, cfg: ModelConfig, ids: list[int], dtype: jnp.dtype, max_len: int, cpu_kernels: bool = False,
    layout: Layout = UNSHARDED, run: Callable[[Program], Any] = run_jitted, rows: ImageRows | None = None,
) -> np.ndarray:
    """Float32 next-token logits [len(ids), V] at every position (lengths padded to `prompt_bucket`).
    cpu_kernels: the weights are packed for them; layout: the mesh the weights are sharded over;
    run: how the program is called; rows: the prompt's image rows (a vision-language model's)."""
    n, size = len(ids), prompt_bucket(len(ids), max_len)
    program = logits_program(weights, cfg, size, dtype, cpu_kernels, layout, rows)
    tokens = np.zeros((1, size), np.int32)
    tokens[0, :n] = ids
    program.args[1] = layout.put(tokens)
    return to_host(run(program))[0, :n]


def prompt_logprobs(
    weights: Weights, cfg: ModelConfig, ids: list[int], k: int, dtype: jnp.dtype, max_len: int,
    cpu_kernels: bool = False, layout: Layout = UNSHARDED, text: TokenText = no_text,
    run: Callable[[Program], Any] = run_jitted, rows: ImageRows | None = None,
) -> list[dict[int, Logprob] | None]:
    """Per prompt token: None for the first, else its id and the top-k ids -> Logprob given the prefix (rows:
    the prompt's image rows, see `all_position_logits`)."""
    logits = all_position_logits(weights, cfg, ids, dtype, max_len, cpu_kernels, layout, run, rows)[:-1]
    logits = logits.astype(np.float64)
    # On the host: a jnp log-softmax would compile a program for each new prompt length.
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))).astype(np.float32)
    out: list[dict[int, Logprob] | None] = [None]
    for i, row in enumerate(logp, start=1):
        top = np.argsort(-row, kind="stable")[:k].tolist() if k else []
        rank = 1 + int(np.count_nonzero(row > row[ids[i]]))
        out.append(position_logprobs(ids[i], row[ids[i]], rank, top, row[top], text))
    return out
