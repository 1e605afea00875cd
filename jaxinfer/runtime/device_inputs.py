"""A host step's NumPy arrays as the compiled programs take them (`engine_step.StepInputs`), with
each row's sampling settings, logit bias, penalty settings and structured-output mask: O(rows)
per step beside the mask, whatever the context (penalty counts stay on the device, see
`penalty_slots`)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from jaxinfer.config.sampling_params import MAX_LOGIT_BIAS, SamplingParams
from jaxinfer.parallel.sharding import Layout
from jaxinfer.runtime.engine_step import RowSampling, StepInputs
from jaxinfer.runtime.host_step import HostStep
from jaxinfer.runtime.packed_tree import PackedTree, pack_host
from jaxinfer.sampling.penalties import PenaltyRows
from jaxinfer.sampling.sampler import sampling_arrays
from jaxinfer.sampling.token_bitmask import all_allowed

if TYPE_CHECKING:
    from jaxinfer.engine.request import Request  # rows carry the engine's requests; only their params are read

PADDING_PARAMS = SamplingParams(temperature=0)  # padding rows: greedy, so they never draw


def device_inputs(
    host: HostStep, slots: np.ndarray, vocab_size: int, layout: Layout, branchless: bool,
) -> PackedTree:
    """The step's inputs as one buffer (see packed_tree), replicated over the mesh (one global array
    when the devices span processes). slots [R]: each row's penalty slot (0: none)."""
    params = [r.params if r is not None else PADDING_PARAMS for r in host.requests]
    seeds = [r.seed if r is not None else 0 for r in host.requests]
    bias_ids, bias = row_logit_bias(host.requests)
    sampling = RowSampling(
        sampling_arrays(params, seeds, branchless), host.stop_ids, host.min_lengths, host.max_lengths, bias_ids,
        bias, row_penalties(params, slots), host.samples, np.asarray([p.logprobs is not None for p in params]),
        step_bitmask(host, vocab_size),
    )
    return layout.put_tree(pack_host(StepInputs(
        tokens=host.tokens, positions=host.positions, token_rows=host.token_rows, page_table=host.page_table,
        lengths=host.lengths, query_lens=host.query_lens, last_index=host.last_index,
        next_tokens=host.next_tokens, sampling=sampling,
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


def row_penalties(params: list[SamplingParams], slots: np.ndarray) -> PenaltyRows:
    """Each row's presence/frequency/repetition settings; rows without a slot get settings that change nothing."""
    values = np.zeros((3, len(params)), np.float32)
    values[2] = 1.0
    for r, p in enumerate(params):
        if slots[r]:
            values[:, r] = (p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
    return PenaltyRows(values[0], values[1], values[2], slots.astype(np.int32))


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
