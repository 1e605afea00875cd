"""On-device token sampling: per-request parameters as arrays, explicit PRNG keys.

`processed_logprobs` gives the distribution actually sampled from (after temperature, top-k,
top-p and min-p); speculative decoding compares exactly these for draft and target.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.sampling.row_order import sorted_descending

NEG_INF = -jnp.inf
ARGMAX_BLOCK = 256  # entries per block of first_argmax (a power of two)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SamplingArrays:
    """Per-sequence sampling parameters, batched."""

    temperature: jax.Array  # [B] float32; 0 = greedy
    top_k: jax.Array  # [B] int32; 0 = off
    top_p: jax.Array  # [B] float32; 1 = off
    min_p: jax.Array  # [B] float32; 0 = off
    keys: jax.Array  # [B, 2] uint32 raw threefry keys, one per request seed
    # Static: compute every row's way (jnp.where) instead of skipping work with lax.cond. A GPU
    # wants it: XLA:GPU copies a conditional's predicate to the host and waits for it.
    branchless: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def filters(self) -> jax.Array:
        """[B] bool: rows that need the (costly) sorted top-k / top-p pass."""
        return (self.top_k > 0) | (self.top_p < 1.0)


def skip_unless(needed: jax.Array, compute, skipped, branchless: bool):
    """compute() when `needed` (a device bool), else skipped(), without a branch when branchless.

    Branchless, compute() always runs: its results must be right for every row (rows that did
    not need it are fixed up by the caller's jnp.where).
    """
    if branchless:
        return compute()
    return jax.lax.cond(needed, compute, skipped)


def seed_key(seed: int) -> np.ndarray:
    """The raw threefry key `jax.random.PRNGKey(seed)` would build, made on host."""
    return np.array([(seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF], dtype=np.uint32)


def seed_keys(seeds: Sequence[int]) -> np.ndarray:
    """[N, 2] uint32: `seed_key` of each seed in one NumPy pass. Seeds are in [-2**63, 2**63) (a
    shared seed broadcast between processes is a signed int32): their 64-bit two's complement words,
    as `seed_key`'s Python shifts and masks give."""
    wide = np.asarray(seeds, np.int64).reshape(-1).view(np.uint64)
    return np.stack([wide >> np.uint64(32), wide & np.uint64(0xFFFFFFFF)], axis=1).astype(np.uint32)


def sampling_arrays(
    params: Sequence[SamplingParams], seeds: Sequence[int], branchless: bool = False
) -> SamplingArrays:
    """Stack per-request parameters as host arrays; `seeds` resolves requests that gave no seed.

    NumPy leaves: callers move the whole step's inputs to the devices in one transfer.
    """
    return SamplingArrays(
        temperature=np.asarray([p.temperature for p in params], np.float32),
        top_k=np.asarray([p.top_k for p in params], np.int32),
        top_p=np.asarray([p.top_p for p in params], np.float32),
        min_p=np.asarray([p.min_p for p in params], np.float32),
        keys=seed_keys(seeds),
        branchless=branchless,
    )


def first_argmax(x: jax.Array) -> jax.Array:
    """jnp.argmax over the last axis (first maximum wins; V where a row has no maximum, e.g. NaN).

    XLA:CPU lowers argmax to a variadic (value, index) reduce, slow over a vocabulary, and a
    max followed by a min over the matching indices spends most of its time in that second
    full-width pass (64 rows of a 49152-token vocabulary on 2 cores: 2-4 ms, against 0.25 for
    the max alone; 32 ms at 128256). So the max is taken per block of up to ARGMAX_BLOCK
    entries and only the first block holding the top value is searched: one full pass (0.4 and
    1.8 ms there). Widths no power of two from 16 up divides keep the two passes.
    """
    width = x.shape[-1]
    block = math.gcd(width, ARGMAX_BLOCK)
    if block < 16:
        return _first_index(x, jnp.max(x, axis=-1, keepdims=True))
    blocks = x.reshape(*x.shape[:-1], width // block, block)
    block_max = jnp.max(blocks, axis=-1)
    top = jnp.max(block_max, axis=-1, keepdims=True)
    first = jnp.minimum(_first_index(block_max, top), width // block - 1)  # clamped for max-less rows
    inside = jnp.take_along_axis(blocks, first[..., None, None], axis=-2)[..., 0, :]
    return first * block + _first_index(inside, top)


def _first_index(x: jax.Array, value: jax.Array) -> jax.Array:
    """Index of the first entry of x's last axis equal to value [..., 1]; the width where none is."""
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(x == value, index, x.shape[-1]), axis=-1)


def _top_k_top_p_mask(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """[B, V] bool of tokens kept by top-k then top-p (ties at the threshold are kept)."""
    vocab = logits.shape[-1]
    ordered = sorted_descending(logits)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    kth = jnp.take_along_axis(ordered, (k - 1)[:, None], axis=-1)
    ordered = jnp.where(jnp.arange(vocab)[None, :] < k[:, None], ordered, NEG_INF)
    probs = jax.nn.softmax(ordered, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    in_nucleus = mass_before < top_p[:, None]
    last_kept = jnp.sum(in_nucleus, axis=-1) - 1
    pth = jnp.take_along_axis(ordered, last_kept[:, None], axis=-1)
    return logits >= jnp.maximum(kth, pth)


def processed_logprobs(logits: jax.Array, params: SamplingArrays) -> jax.Array:
    """Log-probabilities [B, V] after temperature, top-k, top-p and min-p (greedy rows: one-hot)."""
    logits = logits.astype(jnp.float32)
    greedy = params.temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, params.temperature)[:, None]
    filters = params.filters
    keep = skip_unless(
        jnp.any(filters),
        lambda: _top_k_top_p_mask(scaled, params.top_k, params.top_p) | ~filters[:, None],
        lambda: jnp.ones(scaled.shape, bool),
        params.branchless,
    )
    scaled = jnp.where(keep, scaled, NEG_INF)
    logprobs = jax.nn.log_softmax(scaled, axis=-1)
    max_logprob = jnp.max(logprobs, axis=-1, keepdims=True)
    min_p = params.min_p[:, None]
    min_p_ok = (min_p <= 0) | (logprobs >= max_logprob + jnp.log(jnp.maximum(min_p, 1e-38)))
    logprobs = jax.nn.log_softmax(jnp.where(min_p_ok, logprobs, NEG_INF), axis=-1)
    one_hot = jnp.where(jax.nn.one_hot(first_argmax(logits), logits.shape[-1]) > 0, 0.0, NEG_INF)
    return jnp.where(greedy[:, None], one_hot, logprobs)


def step_keys(params: SamplingArrays, positions: jax.Array) -> jax.Array:
    """One key per row for the token at `positions` [B]: depends only on the seed and position."""
    return jax.vmap(jax.random.fold_in)(params.keys, positions.astype(jnp.uint32))


def sample(logits: jax.Array, params: SamplingArrays, positions: jax.Array) -> jax.Array:
    """Next tokens [B] for logits [B, V]; greedy rows take the argmax."""
    greedy = params.temperature <= 0
    argmax = first_argmax(logits)

    def draw() -> jax.Array:
        logprobs = processed_logprobs(logits, params)
        keys = step_keys(params, positions)
        return jax.vmap(jax.random.categorical)(keys, logprobs).astype(jnp.int32)

    drawn = skip_unless(~jnp.all(greedy), draw, lambda: argmax, params.branchless)
    return jnp.where(greedy, argmax, drawn)
