"""Host-side (NumPy) arrays for one device step, padded to shape buckets so programs are reused.

A step's tokens are packed end to end, decode rows first, then each prefill chunk, then padding
(position -1, which writes nothing and attends to nothing that is kept) up to a token bucket;
rows pad to a row bucket (see config/buckets). Padding rows have no tokens, length 1 and page
0 (reserved). Page tables are the runner's (see runtime/host_step).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxinfer.config.buckets import bucket, powers_of_two, ragged_rows, ragged_shapes, token_bucket
from jaxinfer.config.engine import EngineConfig
from jaxinfer.config.sampling_params import MAX_STOP_IDS
from jaxinfer.engine.scheduler import Row, Schedule
from jaxinfer.runtime.host_step import CATCH_UP_WINDOW, HostStep
from jaxinfer.runtime.image_input import image_token_rows


def step_shape(schedule: Schedule, config: EngineConfig, fixed_trips: bool = False) -> tuple[str, int, int]:
    """(program kind, tokens, rows) of the padded step: all-decode schedules one token per row.

    fixed_trips: multi-step decode runs all its decode_steps iterations (a GPU's branchless
    programs), so a call of one step (a constrained or streamed row) takes the ragged program,
    which computes one token per row, not decode_steps of which all but one are thrown away.
    """
    rows = schedule.decodes + schedule.prefills
    if not schedule.prefills and not (fixed_trips and schedule.num_steps == 1):
        padded = bucket(len(rows))
        return "decode", padded, padded
    tokens = token_bucket(sum(row.count for row in rows), config.max_num_batched_tokens)
    return "ragged", tokens, ragged_rows(tokens, config.max_num_seqs)


def build_step(schedule: Schedule, config: EngineConfig, fixed_trips: bool = False) -> HostStep:
    """The packed tokens and per-row metadata of a schedule (decode rows first; fixed_trips: see step_shape)."""
    kind, num_tokens, num_rows = step_shape(schedule, config, fixed_trips)
    step = _empty(num_tokens, num_rows, kind == "decode", schedule.num_steps)
    _fill_decode_rows(step, schedule.decodes)
    offset = len(schedule.decodes)
    for r, row in enumerate(schedule.prefills, start=len(schedule.decodes)):
        _fill_row(step, r, offset, row)
        offset += row.count
    return step


def _empty(num_tokens: int, num_rows: int, decode: bool = False, num_steps: int = 1) -> HostStep:
    """An all-padding step: padding tokens belong to the last row, each row's last index is its first
    token in the decode layout (one token per row)."""
    rows = np.arange(num_rows, dtype=np.int32)
    return HostStep(
        tokens=np.zeros(num_tokens, np.int32),
        positions=np.full(num_tokens, -1, np.int32),
        token_rows=rows.copy() if decode else np.full(num_tokens, num_rows - 1, np.int32),
        lengths=np.ones(num_rows, np.int32),
        query_lens=np.zeros(num_rows, np.int32),
        last_index=rows.copy() if decode else np.zeros(num_rows, np.int32),
        next_tokens=np.full(num_tokens, -1, np.int32),
        stop_ids=np.full((num_rows, MAX_STOP_IDS), -1, np.int32),
        min_lengths=np.zeros(num_rows, np.int32),
        max_lengths=np.ones(num_rows, np.int32),
        samples=np.zeros(num_rows, bool),
        requests=[None] * num_rows,
        num_steps=num_steps,
        decode=decode,
    )


def build_chained_step(schedule: Schedule, config: EngineConfig) -> HostStep:
    """The multi-step decode call of a `Scheduler.chain` schedule: every row carried (the device
    reads its token and length from the call ahead of it; the rows' positions are placeholders)."""
    _, num_tokens, num_rows = step_shape(schedule, config)
    step = _empty(num_tokens, num_rows, True, schedule.num_steps)
    _fill_decode_rows(step, schedule.decodes, carried=True)
    step.carried = np.zeros(num_rows, bool)
    step.carried[: len(schedule.decodes)] = True
    return step


def landed_rows(schedule: Schedule) -> Schedule:
    """A chained call's schedule with its rows where they really started: once the call ahead of it
    landed, each request's last token (build_chained_step's positions were placeholders)."""
    decodes = [Row(row.request, row.request.num_tokens - 1, 1) for row in schedule.decodes]
    return dataclasses.replace(schedule, decodes=decodes)


def _fill_decode_rows(step: HostStep, rows: list[Row], carried: bool = False) -> None:
    """`_fill_row` for decode rows 0..n-1 (one token each, at flat offset r), a write per field;
    carried rows' tokens are left to the device.

    A step holds up to max_num_seqs of them; writing row by row cost the host more than the
    rest of the step's building.
    """
    n = len(rows)
    if not n:
        return
    requests = [row.request for row in rows]
    starts = np.array([row.start for row in rows], np.int32)
    if not carried:
        step.tokens[:n] = [request.ids_between(row.start, row.start + 1)[0] for request, row in zip(requests, rows)]
    step.positions[:n] = starts
    step.token_rows[:n] = np.arange(n)
    step.lengths[:n] = starts + 1
    step.query_lens[:n] = 1
    step.last_index[:n] = np.arange(n)
    step.samples[:n] = True
    step.min_lengths[:n] = [len(request.prompt_ids) + request.params.min_tokens for request in requests]
    step.max_lengths[:n] = [request.max_total for request in requests]
    step.requests[:n] = requests
    for r, request in enumerate(requests):
        stops = request.stop_ids[:MAX_STOP_IDS]
        step.stop_ids[r, : len(stops)] = stops


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
    if request.images and drafts is None:
        _mark_image_tokens(step, offset, row)
    _fill_row_layout(step, r, offset, row)


def _mark_image_tokens(step: HostStep, offset: int, row: Row) -> None:
    """Point the chunk's image placeholders at their rows of the request's image features."""
    chunk, rows = image_token_rows(row.request.images, row.start, row.count)
    if len(chunk):
        if step.image_tokens is None:
            step.image_tokens = np.full(len(step.tokens), -1, np.int32)
        step.image_tokens[offset + chunk] = rows


def _fill_row_layout(step: HostStep, r: int, offset: int, row: Row) -> None:
    """Row r's positions, length and sampling limits (its tokens are the caller's to write)."""
    request = row.request
    end = offset + row.count
    step.positions[offset:end] = np.arange(row.start, row.start + row.count)
    step.token_rows[offset:end] = r
    step.lengths[r] = row.start + row.count
    step.query_lens[r] = row.count
    step.last_index[r] = end - 1
    step.samples[r] = row.samples
    stops = request.stop_ids[:MAX_STOP_IDS]
    step.stop_ids[r, : len(stops)] = stops
    step.min_lengths[r] = len(request.prompt_ids) + request.params.min_tokens
    step.max_lengths[r] = request.max_total
    step.requests[r] = request


def program_shapes(
    config: EngineConfig, verify_chunk: int | None = None, draft_on_device: bool = False
) -> list[tuple[str, int, int]]:
    """Every (program kind, tokens, rows) a workload under `config` can produce: the step programs.

    verify_chunk: the engine speculates (verify steps of that chunk); draft_on_device: with a draft
    model or EAGLE head, whose ragged steps also come without its reads ("ragged_unread").
    """
    ragged = ragged_shapes(config.max_num_batched_tokens, config.max_num_seqs)
    kinds = ("ragged", "ragged_unread") if draft_on_device else ("ragged",)
    shapes = [(kind, tokens, rows) for kind in kinds for tokens, rows in ragged]
    rows = powers_of_two(1, config.max_num_seqs)
    shapes += [("decode", r, r) for r in rows]
    if verify_chunk is not None:
        shapes += [("verify", r * verify_chunk, r) for r in rows]
    return shapes


def empty_step(kind: str, num_tokens: int, num_rows: int, decode_steps: int) -> HostStep:
    """An all-padding step of one program's shape (compiles the program, computes nothing that is kept)."""
    if kind in ("ragged", "ragged_unread"):
        return dataclasses.replace(_empty(num_tokens, num_rows), draft_reads=kind == "ragged")
    if kind == "decode":
        return _empty(num_rows, num_rows, decode=True, num_steps=decode_steps)
    step = _empty(num_tokens, num_rows)
    chunk = num_tokens // num_rows
    step.token_rows[:] = np.repeat(np.arange(num_rows), chunk)
    step.last_index[:] = np.arange(num_rows) * chunk
    step.drafts = np.zeros((num_rows, chunk - 1), np.int32)
    step.num_drafts = np.zeros(num_rows, np.int32)
    _verify_fields(step, num_rows)
    return step


def build_verify_step(
    schedule: Schedule, drafts: list[np.ndarray], chunk: int, page_size: int, width: int, rounds: int = 1,
    carried: bool = False,
) -> HostStep:
    """Every decode row as one chunk `[last token, drafts...]` (padded to `chunk`) for `verify_step`.

    carried: a `Scheduler.chain` schedule, started before the call ahead lands: the device lays
    each row's chunk out from the decode carry (`runtime/verify_carry`), so its tokens and
    positions here are placeholders, and only the drafts' counts count (a device drafter's).
    """
    rows = bucket(len(schedule.decodes))
    step = empty_step("verify", rows * chunk, rows, 1)
    step.num_rounds = rounds
    for r, (row, draft) in enumerate(zip(schedule.decodes, drafts)):
        verified = dataclasses.replace(row, count=1 + len(draft))
        if carried:
            _fill_row_layout(step, r, r * chunk, verified)
        else:
            _fill_row(step, r, r * chunk, verified, draft)
            step.drafts[r, : len(draft)] = draft
        step.samples[r] = True  # the row's chunk runs past its known tokens (its sampling slot is read)
        step.num_drafts[r] = len(draft)
        step.capacity[r] = min(len(row.request.pages), width) * page_size
        start = step.draft_start[r] = row.start if carried else min(row.request.draft_computed, row.start)
        ids = [] if carried else row.request.ids_between(start, min(row.start + 1, start + CATCH_UP_WINDOW))
        step.window[r, : len(ids)] = ids
    if carried:
        step.carried = np.arange(rows) < len(schedule.decodes)
    return step


def _verify_fields(step: HostStep, rows: int) -> None:
    step.capacity = np.zeros(rows, np.int32)
    step.draft_start = np.zeros(rows, np.int32)
    step.window = np.zeros((rows, CATCH_UP_WINDOW), np.int32)


def warmup_steps(config: EngineConfig, verify_chunk: int | None, draft_on_device: bool = False) -> list[HostStep]:
    """A padding-only step of every program's shape (see program_shapes)."""
    return [empty_step(*shape, config.decode_steps)
            for shape in program_shapes(config, verify_chunk, draft_on_device)]


def profile_steps(config: EngineConfig, verify_chunk: int | None) -> list[HostStep]:
    """The steps whose programs hold the most activations: the widest step with prefill chunks (most
    tokens, then rows), and when speculating the widest verify step (logits at every token)."""
    shapes = program_shapes(config, verify_chunk)
    ragged = max((s for s in shapes if s[0] == "ragged"), key=lambda s: (s[1], s[2]))
    widest = [ragged] + ([max((s for s in shapes if s[0] == "verify"), key=lambda s: s[2])] if verify_chunk else [])
    return [empty_step(*shape, config.decode_steps) for shape in widest]


def padding_waste(schedule: Schedule, config: EngineConfig) -> tuple[int, int]:
    """(padded tokens, real tokens) of a schedule's step (see step_shape)."""
    _, tokens, _ = step_shape(schedule, config)
    return tokens, sum(row.count for row in schedule.decodes + schedule.prefills)

