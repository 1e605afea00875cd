"""A host step's NumPy arrays as the compiled programs take them (`engine_step.StepInputs`), with
each row's sampling settings, its row slot and the page entries the slots gained: O(rows) bytes
per step whatever the context and vocabulary, in one transfer with what the step's program
takes beside them (`step_extras`). Page tables, penalty counts and logit bias stay on the device
per row slot (see `row_state`); the structured-output bitmask is a program argument of its own
(see `ModelRunner`)."""

from __future__ import annotations

import numpy as np

from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.parallel.sharding import Layout
from jaxinfer.runtime.engine_step import RowSampling, StepInputs
from jaxinfer.runtime.host_step import HostStep
from jaxinfer.runtime.mrope_positions import step_offsets
from jaxinfer.runtime.packed_tree import PackedTree, pack_host
from jaxinfer.runtime.row_slots import holds_sampling_state
from jaxinfer.runtime.verify_step import Drafts
from jaxinfer.sampling.penalties import PenaltyRows
from jaxinfer.sampling.sampler import sampling_arrays

PADDING_PARAMS = SamplingParams(temperature=0)  # padding rows: greedy, so they never draw


def device_inputs(
    host: HostStep, row_slots: np.ndarray, entries: np.ndarray, width: int, layout: Layout, branchless: bool,
    mrope: bool = False,
) -> PackedTree:
    """(the step's `StepInputs`, its `step_extras`) as one buffer (see packed_tree), replicated over
    the mesh (one global array when the devices span processes). row_slots [R]: each row's slot
    (0: padding); entries [D, 3]: the page entries the slots gained (see page_table_diffs); mrope: the
    model rotates by M-RoPE (its tokens' rotary offsets go too)."""
    params = [r.params if r is not None else PADDING_PARAMS for r in host.requests]
    seeds = [r.seed if r is not None else 0 for r in host.requests]
    sampling = RowSampling(
        sampling_arrays(params, seeds, branchless), host.stop_ids, host.min_lengths, host.max_lengths,
        bias_ids=None, bias=None, penalties=row_penalties(params, row_slots), samples=host.samples,
        want_logprobs=np.asarray([p.logprobs is not None for p in params]), bitmask=None,
    )
    inputs = StepInputs(
        tokens=host.tokens, positions=host.positions, token_rows=host.token_rows, row_slots=row_slots,
        adapters=np.asarray([r.adapter_slot if r is not None else -1 for r in host.requests], np.int32),
        page_entries=entries, page_counts=page_counts(host.requests, width), page_table=None,
        lengths=host.lengths, query_lens=host.query_lens, last_index=host.last_index,
        next_tokens=host.next_tokens, sampling=sampling,
        carried=np.zeros(len(host.lengths), bool) if host.carried is None else host.carried,
        rope_offsets=step_offsets(host) if mrope else None,
    )
    return layout.put_tree(pack_host((inputs, step_extras(host))))


def step_extras(host: HostStep) -> tuple:
    """The arguments a step's program takes after its inputs and bitmask: a multi-step decode call's
    step count; a verify call's drafts, rounds, the positions each row's pages hold and its draft's
    catch-up (first unread position and the tokens from there); nothing for a ragged step."""
    if host.drafts is not None:
        return (Drafts(host.drafts, host.num_drafts), np.int32(host.num_rounds), host.capacity, host.window,
                host.draft_start)
    if host.decode:
        return (np.int32(host.num_steps),)
    return ()


def page_counts(requests: list, width: int) -> np.ndarray:
    """[R] int32 pages each row's request holds (at most the table's width; padding rows none)."""
    return np.asarray([min(len(r.pages), width) if r is not None else 0 for r in requests], np.int32)


def row_penalties(params: list[SamplingParams], row_slots: np.ndarray) -> PenaltyRows:
    """Each row's presence/frequency/repetition settings and the slot its sampling state is read from:
    its own where it has some, else 0 (settings that change nothing, no counts kept)."""
    values = np.zeros((3, len(params)), np.float32)
    values[2] = 1.0
    slots = np.zeros(len(params), np.int32)
    for r, p in enumerate(params):
        if row_slots[r] and holds_sampling_state(p):
            values[:, r] = (p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
            slots[r] = row_slots[r]
    return PenaltyRows(values[0], values[1], values[2], slots)
