"""Embeddings of whole prompts (vLLM's `LLM.embed`, the server's /v1/embeddings): prompts padded into
batches, one pass of the model's own forward each, every row's final hidden states pooled by its real
length on the device (and through a classifier's head there: `LLM.classify`, `LLM.score`); Matryoshka
truncation and unit length on the host.

Lengths pad to the prompt-logprobs buckets (`prompt_logprobs.prompt_bucket`: 64, 256, 1024, ...,
max_seq_len) and a pass's rows to a power of two, at most `max_tokens` tokens a pass (one prompt at
least): a pass per (length bucket, rows, pooling type), few programs, compiled on first use or by
`embedding_programs` (a pooling server's warm-up). Prompts are sorted by length first, so a batch's
padding stays within its bucket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.cache.contiguous import init_cache
from jaxinfer.config.buckets import bucket
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights
from jaxinfer.models.encoder import EncoderWeights
from jaxinfer.models.encoder_heads import EncoderHead
from jaxinfer.parallel.sharding import UNSHARDED, Layout, to_host
from jaxinfer.runtime import step_programs
from jaxinfer.runtime.executables import Program
from jaxinfer.runtime.prompt_logprobs import prompt_bucket, prompt_buckets, run_jitted


def max_rows(size: int, max_tokens: int) -> int:
    """The most rows a pass of `size`-token rows holds: the largest power of two within max_tokens, 1 at least."""
    return 1 << max(0, (max_tokens // size).bit_length() - 1)


def embedding_batches(lengths: list[int], max_len: int, max_tokens: int) -> list[tuple[int, list[int]]]:
    """(padded length, the prompts' indices) of each pass: prompts sorted by length, those of one length
    bucket together, at most `max_rows` a pass."""
    by_size: dict[int, list[int]] = {}
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        by_size.setdefault(prompt_bucket(lengths[i], max_len), []).append(i)
    passes = []
    for size, members in by_size.items():
        rows = max_rows(size, max_tokens)
        passes += [(size, members[k : k + rows]) for k in range(0, len(members), rows)]
    return passes


def pooled_program(
    weights: Weights, cfg: ModelConfig, size: int, rows: int, dtype: jnp.dtype, pooling: str,
    cpu_kernels: bool = False, layout: Layout = UNSHARDED, head: jax.Array | None = None,
) -> Program:
    """The pooled pass over `rows` x `size` tokens (zeros, lengths 1: filled in by `pooled_embeddings`);
    with a classifier's head, its logits. An encoder's (BERT, RoBERTa) attends both ways and keeps no cache."""
    tokens = layout.put(np.zeros((rows, size), np.int32))
    lengths = layout.put(np.ones(rows, np.int32))
    if isinstance(weights, EncoderWeights):
        return Program(step_programs.encoder_pooled, [weights, tokens, lengths, head], dict(pooling=pooling), fixed=1)
    cache = init_cache(cfg, rows, size, dtype, cpu_kernels, layout)
    return Program(step_programs.pooled_hidden, [weights, tokens, lengths, cache, head],
                   dict(cfg=cfg, pooling=pooling), fixed=1)


def embedding_programs(
    weights: Weights, cfg: ModelConfig, dtype: jnp.dtype, max_len: int, max_tokens: int, pooling: str,
    cpu_kernels: bool = False, layout: Layout = UNSHARDED, head: jax.Array | None = None,
) -> list[Callable[[], Program]]:
    """Every pass a pooling type may run (each length bucket, each power of two of rows): what warm-up compiles."""
    return [
        lambda size=size, rows=rows: pooled_program(weights, cfg, size, rows, dtype, pooling, cpu_kernels, layout,
                                                    head)
        for size in prompt_buckets(max_len)
        for rows in (1 << k for k in range(max_rows(size, max_tokens).bit_length()))
    ]


def output_width(cfg: ModelConfig, head: Any) -> int:
    """A pooled pass's output width: the final hidden states' (OPT-350M's: its embeddings'), or a classifier head's
    labels."""
    if head is None:
        return cfg.embedding_size
    return head.out.weight.shape[1] if isinstance(head, EncoderHead) else head.shape[0]


def pooled_embeddings(
    weights: Weights, cfg: ModelConfig, prompts: list[list[int]], dtype: jnp.dtype, max_len: int, max_tokens: int,
    pooling: str = "last", cpu_kernels: bool = False, layout: Layout = UNSHARDED,
    run: Callable[[Program], Any] = run_jitted, on_pass: Callable[[int], object] | None = None,
    head: jax.Array | None = None,
) -> np.ndarray:
    """Float32 [len(prompts), hidden size]: each prompt's pooled final hidden states, in order; with a
    classifier's head ([num_labels, D], or an encoder's EncoderHead), its logits [len(prompts), num_labels].
    on_pass(n): told after each pass how many prompts it finished (a progress bar)."""
    out = np.zeros((len(prompts), output_width(cfg, head)), np.float32)
    for size, members in embedding_batches([len(p) for p in prompts], max_len, max_tokens):
        rows = bucket(len(members))
        program = pooled_program(weights, cfg, size, rows, dtype, pooling, cpu_kernels, layout, head)
        tokens, lengths = np.zeros((rows, size), np.int32), np.ones(rows, np.int32)  # padding rows: length 1
        for row, i in enumerate(members):
            tokens[row, : len(prompts[i])] = prompts[i]
            lengths[row] = len(prompts[i])
        program.args[1], program.args[2] = layout.put(tokens), layout.put(lengths)
        out[members] = np.asarray(to_host(run(program)), np.float32)[: len(members)]
        if on_pass is not None:
            on_pass(len(members))
    return out


def finish_embeddings(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """Vectors [N, D] cut to their first `dimensions` (Matryoshka), then unit length when `normalize`
    (vLLM's order: the shortened vector is what is normalized)."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    if normalize:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return vectors
