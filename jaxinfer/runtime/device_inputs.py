"""A host step's NumPy arrays as the compiled programs take them (`engine_step.StepInputs`), with
each row's sampling settings and sampling slot: O(rows) bytes per step whatever the context and
vocabulary. Penalty counts and logit bias stay on the device in the rows' sampling slots (see
`sampling_slots`); the structured-output bitmask is a program argument of its own (see
`ModelRunner`)."""

from __future__ import annotations

import numpy as np

from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.parallel.sharding import Layout
from jaxinfer.runtime.engine_step import RowSampling, StepInputs
from jaxinfer.runtime.host_step import HostStep
from jaxinfer.runtime.packed_tree import PackedTree, pack_host
from jaxinfer.sampling.penalties import PenaltyRows
from jaxinfer.sampling.sampler import sampling_arrays

PADDING_PARAMS = SamplingParams(temperature=0)  # padding rows: greedy, so they never draw


def device_inputs(host: HostStep, slots: np.ndarray, layout: Layout, branchless: bool) -> PackedTree:
    """The step's inputs as one buffer (see packed_tree), replicated over the mesh (one global array
    when the devices span processes). slots [R]: each row's sampling slot (0: none)."""
    params = [r.params if r is not None else PADDING_PARAMS for r in host.requests]
    seeds = [r.seed if r is not None else 0 for r in host.requests]
    sampling = RowSampling(
        sampling_arrays(params, seeds, branchless), host.stop_ids, host.min_lengths, host.max_lengths,
        bias_ids=None, bias=None, penalties=row_penalties(params, slots), samples=host.samples,
        want_logprobs=np.asarray([p.logprobs is not None for p in params]), bitmask=None,
    )
    return layout.put_tree(pack_host(StepInputs(
        tokens=host.tokens, positions=host.positions, token_rows=host.token_rows, page_table=host.page_table,
        lengths=host.lengths, query_lens=host.query_lens, last_index=host.last_index,
        next_tokens=host.next_tokens, sampling=sampling,
    )))


def row_penalties(params: list[SamplingParams], slots: np.ndarray) -> PenaltyRows:
    """Each row's presence/frequency/repetition settings; rows without a slot get settings that change nothing."""
    values = np.zeros((3, len(params)), np.float32)
    values[2] = 1.0
    for r, p in enumerate(params):
        if slots[r]:
            values[:, r] = (p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
    return PenaltyRows(values[0], values[1], values[2], slots.astype(np.int32))
