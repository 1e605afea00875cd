"""A host step's NumPy arrays as the compiled programs take them (`engine_step.StepInputs`),
with each row's sampling settings, logit bias and structured-output mask and, when a row asks for
them, its penalty counts."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from jaxinfer.config.sampling_params import MAX_LOGIT_BIAS, SamplingParams
from jaxinfer.parallel.sharding import Layout
from jaxinfer.runtime.engine_step import RowSampling, StepInputs
from jaxinfer.runtime.host_step import HostStep
from jaxinfer.runtime.packed_tree import PackedTree, pack_host
from jaxinfer.sampling.penalties import Penalties
from jaxinfer.sampling.sampler import sampling_arrays
from jaxinfer.sampling.token_bitmask import all_allowed

if TYPE_CHECKING:
    from jaxinfer.engine.request import Request  # rows carry the engine's requests; only their params are read

PADDING_PARAMS = SamplingParams(temperature=0)  # padding rows: greedy, so they never draw


def device_inputs(host: HostStep, vocab_size: int, layout: Layout) -> PackedTree:
    """The step's inputs as one buffer (see packed_tree), replicated over the mesh (one global array
    when the devices span processes)."""
    live = [r for r in host.requests if r is not None]
    params = [r.params if r is not None else PADDING_PARAMS for r in host.requests]
    seeds = [r.seed if r is not None else 0 for r in host.requests]
    penalties = row_penalties(host, vocab_size) if any(r.params.penalized for r in live) else None
    bias_ids, bias = row_logit_bias(host.requests)
    sampling = RowSampling(
        sampling_arrays(params, seeds), host.stop_ids, host.min_lengths, host.max_lengths, bias_ids, bias, penalties,
        step_bitmask(host, vocab_size),
    )
    return layout.put_tree(pack_host(StepInputs(
        tokens=host.tokens, positions=host.positions, token_rows=host.token_rows, page_table=host.page_table,
        lengths=host.lengths, query_lens=host.query_lens, last_index=host.last_index,
        next_tokens=host.next_tokens, sampling=sampling,
        num_decode=host.num_decode, want_logprobs=any(r.params.logprobs is not None for r in live),
    )))


def step_bitmask(host: HostStep, vocab_size: int) -> np.ndarray:
    """The step's structured-output masks, or all ones of the same shape: always an input, so constrained
    and free rows run the programs warm-up compiled."""
    if host.bitmask is not None:
        return host.bitmask
    positions = len(host.tokens) if host.drafts is not None else len(host.requests)
    return _free_bitmask(positions, vocab_size)


@functools.lru_cache(maxsize=64)
def _free_bitmask(positions: int, vocab_size: int) -> np.ndarray:
    """One read-only all-ones mask per shape (not a new array per step)."""
    mask = all_allowed(positions, vocab_size)
    mask.flags.writeable = False
    return mask


def row_penalties(host: HostStep, vocab_size: int) -> Penalties:
    """Each row's presence/frequency/repetition settings and its output counts and prompt tokens."""
    rows = len(host.requests)
    counts, in_prompt = np.zeros((rows, vocab_size), np.int32), np.zeros((rows, vocab_size), bool)
    values = np.zeros((3, rows), np.float32)
    values[2] = 1.0
    for r, request in enumerate(host.requests):
        if request is None:
            continue
        np.add.at(counts[r], request.output_ids, 1)
        in_prompt[r, request.prompt_ids] = True
        p = request.params
        values[:, r] = (p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
    return Penalties(values[0], values[1], values[2], counts, in_prompt)


def row_logit_bias(requests: list[Request | None]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's logit_bias as (token ids [R, MAX_LOGIT_BIAS], -1 padded; biases [R, MAX_LOGIT_BIAS]).

    Always the full width, so a biased request runs the programs warm-up compiled.
    """
    ids = np.full((len(requests), MAX_LOGIT_BIAS), -1, np.int32)
    bias = np.zeros((len(requests), MAX_LOGIT_BIAS), np.float32)
    for r, request in enumerate(requests):
        if request is not None and request.params.logit_bias:
            count = len(request.params.logit_bias)
            ids[r, :count] = list(request.params.logit_bias)
            bias[r, :count] = list(request.params.logit_bias.values())
    return ids, bias
