"""Host-side (NumPy) arrays for one device step, padded to shape buckets so programs are reused.

Rows and chunks pad as `buckets` says, pages per row to a power of two. Padding rows have no
tokens, length 1 and page 0 (reserved), so they read a harmless page and write nothing.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxinfer.config.buckets import CHUNK_STEP, bucket, chunk_bucket, chunk_buckets, powers_of_two
from jaxinfer.config.engine import EngineConfig
from jaxinfer.engine.scheduler import Row, Schedule
from jaxinfer.runtime.host_step import HostStep

MIN_STOP_SLOTS = 4


def shape_buckets(
    schedule: Schedule, page_size: int, max_pages: int, min_pages: int, narrow_mixed: bool,
    chunk_step: int = CHUNK_STEP,
) -> tuple[int, int, int, int]:
    """(decode rows, prefill rows, chunk length, pages per row) of the padded step.

    All-decode steps bucket the page-table width; steps with a prefill chunk use the full
    width unless narrow_mixed (the gathered CPU attention pays for width, kernels do not), so
    they add fewer programs where width is free.
    """
    num_decode = bucket(len(schedule.decodes))
    num_prefill = bucket(len(schedule.prefills))
    chunk = chunk_bucket(max((r.count for r in schedule.prefills), default=0), chunk_step)
    if schedule.prefills and not narrow_mixed:
        return num_decode, num_prefill, chunk, max_pages
    extra = schedule.num_steps - 1
    rows = schedule.decodes + schedule.prefills
    needed = max(-(-(r.start + r.count + extra) // page_size) for r in rows)
    return num_decode, num_prefill, chunk, min(bucket(needed, min_pages), max_pages)


def build_step(
    schedule: Schedule, page_size: int, max_pages: int, min_pages: int = 1, narrow_mixed: bool = False,
    chunk_step: int = CHUNK_STEP,
) -> HostStep:
    """Flat tokens [decodes][prefill rows x chunk] and per-row metadata for a schedule."""
    num_decode, num_prefill, chunk, pages = shape_buckets(
        schedule, page_size, max_pages, min_pages, narrow_mixed, chunk_step
    )
    rows = num_decode + num_prefill
    prefills = schedule.prefills + [None] * (num_prefill - len(schedule.prefills))
    n = num_decode + num_prefill * chunk
    step = _empty(n, rows, pages, _stop_width(schedule), num_decode, schedule.num_steps)
    step.token_rows[:num_decode] = np.arange(num_decode)
    step.last_index[:num_decode] = np.arange(num_decode)
    _fill_decode_rows(step, schedule.decodes)
    for i, row in enumerate(prefills):
        r, offset = num_decode + i, num_decode + i * chunk
        step.token_rows[offset : offset + chunk] = r
        step.last_index[r] = offset
        if row is not None:
            _fill_row(step, r, offset, row)
    return step


def _fill_decode_rows(step: HostStep, rows: list[Row]) -> None:
    """`_fill_row` for decode rows 0..n-1 (one token each, at flat offset r), a write per field.

    A step holds up to max_num_seqs of them; writing row by row cost the host more than the
    rest of the step's building.
    """
    n = len(rows)
    if not n:
        return
    requests = [row.request for row in rows]
    starts = np.array([row.start for row in rows], np.int32)
    step.tokens[:n] = [request.ids_between(row.start, row.start + 1)[0] for request, row in zip(requests, rows)]
    step.positions[:n] = starts
    step.lengths[:n] = starts + 1
    step.query_lens[:n] = 1
    step.min_lengths[:n] = [len(request.prompt_ids) + request.params.min_tokens for request in requests]
    step.max_lengths[:n] = [request.max_total for request in requests]
    step.requests[:n] = requests
    width = step.page_table.shape[1]
    for r, request in enumerate(requests):
        table = request.pages[:width]
        step.page_table[r, : len(table)] = table
        if request.stop_ids:
            step.stop_ids[r, : len(request.stop_ids)] = request.stop_ids


def _stop_width(schedule: Schedule) -> int:
    longest = max(len(r.request.stop_ids) for r in schedule.decodes + schedule.prefills)
    return bucket(max(longest, 1), MIN_STOP_SLOTS)


def _empty(n: int, rows: int, pages: int, stop_width: int, num_decode: int, num_steps: int) -> HostStep:
    return HostStep(
        tokens=np.zeros(n, np.int32),
        positions=np.full(n, -1, np.int32),
        token_rows=np.zeros(n, np.int32),
        page_table=np.zeros((rows, pages), np.int32),
        lengths=np.ones(rows, np.int32),
        query_lens=np.zeros(rows, np.int32),
        last_index=np.zeros(rows, np.int32),
        next_tokens=np.full(n, -1, np.int32),
        stop_ids=np.full((rows, stop_width), -1, np.int32),
        min_lengths=np.zeros(rows, np.int32),
        max_lengths=np.ones(rows, np.int32),
        requests=[None] * rows,
        num_decode=num_decode,
        num_steps=num_steps,
    )


def _fill_row(step: HostStep, r: int, offset: int, row: Row, drafts: np.ndarray | None = None) -> None:
    """Row r's tokens from offset; a verify row's tokens past the last known one are its drafts."""
    request = row.request
    ids = request.ids_between(row.start, row.start + row.count - (0 if drafts is None else len(drafts)))
    if drafts is not None:
        ids = ids + drafts.tolist()
    else:  # the prompt tokens after this chunk's (an EAGLE head reads each token's successor)
        following = request.ids_between(row.start + 1, min(row.start + row.count + 1, request.num_tokens))
        step.next_tokens[offset : offset + len(following)] = following
    step.tokens[offset : offset + row.count] = ids
    step.positions[offset : offset + row.count] = np.arange(row.start, row.start + row.count)
    table = request.pages[: step.page_table.shape[1]]
    step.page_table[r, : len(table)] = table
    step.lengths[r] = row.start + row.count
    step.query_lens[r] = row.count
    step.last_index[r] = offset + row.count - 1
    step.stop_ids[r, : len(request.stop_ids)] = request.stop_ids
    step.min_lengths[r] = len(request.prompt_ids) + request.params.min_tokens
    step.max_lengths[r] = request.max_total
    step.requests[r] = request


def warmup_shapes(
    config: EngineConfig, min_pages: int, max_pages: int, narrow_mixed: bool = False, chunk_step: int = CHUNK_STEP
) -> list[tuple[int, int, int, int, int]]:
    """Every (decode rows, prefill rows, chunk, pages, steps) a workload under `config` can produce."""
    decodes = [0] + powers_of_two(1, config.max_num_seqs)
    prefill_shapes = [
        (rows, chunk)
        for rows in powers_of_two(1, config.max_prefill_seqs)
        for chunk in chunk_buckets(config.max_num_batched_tokens, chunk_step)
        if rows == 1 or rows * chunk <= bucket(config.max_num_batched_tokens)
    ]
    widths = powers_of_two(min_pages, max_pages)
    mixed_widths = widths if narrow_mixed else [max_pages]
    shapes = [(d, r, c, w, 1) for w in mixed_widths for d in decodes for r, c in prefill_shapes]
    for pages in widths:
        for d in decodes[1:]:
            shapes.append((d, 0, 0, pages, 1))
            if config.decode_steps > 1:
                shapes.append((d, 0, 0, pages, config.decode_steps))
    return shapes


def program_steps(num_steps: int, decode_steps: int) -> int:
    """The compiled variant a call of num_steps decode steps runs: the plain step for one, else the
    multi-step program of decode_steps (which takes the step count as data, so fewer compile nothing)."""
    return 1 if num_steps == 1 else decode_steps


def empty_step(num_decode: int, num_prefill: int, chunk: int, pages: int, num_steps: int) -> HostStep:
    """An all-padding step of the given shape (compiles the program, computes nothing that is kept)."""
    rows = num_decode + num_prefill
    step = _empty(num_decode + num_prefill * chunk, rows, pages, MIN_STOP_SLOTS, num_decode, num_steps)
    step.token_rows[num_decode:] = np.repeat(np.arange(num_decode, rows), chunk)
    step.token_rows[:num_decode] = np.arange(num_decode)
    step.last_index[:num_decode] = np.arange(num_decode)
    step.last_index[num_decode:] = num_decode + np.arange(num_prefill) * chunk
    return step


def build_verify_step(
    schedule: Schedule, drafts: list[np.ndarray], chunk: int, page_size: int, max_pages: int, min_pages: int = 1,
    rounds: int = 1,
) -> HostStep:
    """Every decode row as one chunk `[last token, drafts...]` (padded to `chunk`) for `batch_verify`,
    with a page table wide enough for `rounds` rounds where the rows' pages reach."""
    rows = bucket(len(schedule.decodes))
    needed = max(
        min(-(-(row.start + rounds * chunk) // page_size), len(row.request.pages)) for row in schedule.decodes
    )
    pages = min(bucket(needed, min_pages), max_pages)
    step = _empty(rows * chunk, rows, pages, _stop_width(schedule), 0, 1)
    step.token_rows[:] = np.repeat(np.arange(rows), chunk)
    step.last_index[:] = np.arange(rows) * chunk
    step.drafts = np.zeros((rows, chunk - 1), np.int32)
    step.num_drafts = np.zeros(rows, np.int32)
    step.num_rounds = rounds
    _verify_fields(step, rows, pages * page_size)
    for r, (row, draft) in enumerate(zip(schedule.decodes, drafts)):
        _fill_row(step, r, r * chunk, dataclasses.replace(row, count=1 + len(draft)), draft)
        step.drafts[r, : len(draft)] = draft
        step.num_drafts[r] = len(draft)
        step.capacity[r] = min(len(row.request.pages), pages) * page_size
        ids = row.request.all_ids[: row.start + 1]
        step.history[r, : len(ids)] = ids
        step.draft_start[r] = min(row.request.draft_computed, row.start)
    return step


def _verify_fields(step: HostStep, rows: int, positions: int) -> None:
    step.capacity = np.zeros(rows, np.int32)
    step.history = np.zeros((rows, positions), np.int32)
    step.draft_start = np.zeros(rows, np.int32)


def empty_verify_step(rows: int, chunk: int, pages: int, page_size: int) -> HostStep:
    """An all-padding verify step of the given shape (compiles the program)."""
    step = empty_step(0, rows, chunk, pages, 1)
    step.drafts = np.zeros((rows, chunk - 1), np.int32)
    step.num_drafts = np.zeros(rows, np.int32)
    _verify_fields(step, rows, pages * page_size)
    return step


def warmup_steps(
    config: EngineConfig, min_pages: int, max_pages: int, narrow_mixed: bool, chunk_step: int,
    verify_chunk: int | None,
) -> list[HostStep]:
    """A padding-only step of every shape the knobs allow (verify steps too when verify_chunk is set)."""
    hosts = [empty_step(*shape) for shape in warmup_shapes(config, min_pages, max_pages, narrow_mixed, chunk_step)]
    if verify_chunk is not None:
        hosts += [
            empty_verify_step(rows, verify_chunk, pages, config.page_size)
            for rows in powers_of_two(1, config.max_num_seqs)
            for pages in powers_of_two(min_pages, max_pages)
        ]
    return hosts


def profile_steps(
    config: EngineConfig, min_pages: int, max_pages: int, narrow_mixed: bool, chunk_step: int,
    verify_chunk: int | None,
) -> list[HostStep]:
    """The steps whose programs hold the most activations: the widest step with prefill chunks (most
    tokens, then rows), and when speculating the widest verify step (logits at every token)."""
    shapes = warmup_shapes(config, min_pages, max_pages, narrow_mixed, chunk_step)
    widest = max(shapes, key=lambda shape: (shape[0] + shape[1] * shape[2], shape[0] + shape[1], shape[3]))
    hosts = [empty_step(*widest)]
    if verify_chunk is not None:
        hosts.append(empty_verify_step(bucket(config.max_num_seqs), verify_chunk, max_pages, config.page_size))
    return hosts
