"""One engine step as host (NumPy) arrays: what the engine's step builder makes and the runner runs.

Plain data, no jax: the engine builds it, `device_inputs` ships it. A step is T tokens packed end
to end (each row's tokens contiguous, then padding with position -1) over R rows, so T and R are
the only shape buckets. Page tables are not part of it: the runner keeps them on the device per
row slot and ships what the rows' page lists gained (runtime/page_table_diffs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

# A draft model or EAGLE head catches up on the positions it has not read (after plain calls or a
# prefix hit) in a verify call: CATCH_UP_CHUNK positions per row and forward, at most
# CATCH_UP_ROUNDS forwards a call (a GPU's loop of known trip count runs them all); the step ships
# each row's tokens from its first unread position on, CATCH_UP_WINDOW of them (the EAGLE head
# reads the token after each position), not its whole history.
CATCH_UP_CHUNK = 16
CATCH_UP_ROUNDS = 4
CATCH_UP_SPAN = CATCH_UP_CHUNK * CATCH_UP_ROUNDS
CATCH_UP_WINDOW = CATCH_UP_SPAN + 1


def caught_up(start: int, end: int) -> int:
    """The position up to which a verify call brings a draft that had read positions < start (of end)."""
    return min(end, start + CATCH_UP_SPAN)


@dataclasses.dataclass
class HostStep:
    """NumPy fields of `engine_step.StepInputs` plus per-row sampling inputs: the runner's input contract."""

    tokens: np.ndarray  # [T] int32
    positions: np.ndarray  # [T] int32, -1 for padding
    token_rows: np.ndarray  # [T] int32 row of each token
    lengths: np.ndarray  # [R] int32 tokens of each row once this step's are written
    query_lens: np.ndarray  # [R] int32 this step's tokens per row (0: a padding row)
    last_index: np.ndarray  # [R] int32 flat index of each row's last token
    next_tokens: np.ndarray  # [T] the token after each flat token where known, else -1
    stop_ids: np.ndarray  # [R, MAX_STOP_IDS] int32, -1 padded
    min_lengths: np.ndarray  # [R] int32
    max_lengths: np.ndarray  # [R] int32
    samples: np.ndarray  # [R] bool: the row's sampled token is kept (a decode, or a prompt's last chunk)
    requests: list[Any]  # per row, the engine's request (None for padding); the runner reads its params
    num_steps: int = 1  # decode steps of an all-decode call
    # [R] bool rows whose token and length the device carries from the decode call ahead of this one
    # (their tokens, positions and lengths here are placeholders); None: none
    carried: np.ndarray | None = None
    decode: bool = False  # every row one decode token (T == R): the multi-step decode program runs it
    # A ragged step's draft model or EAGLE head reads its tokens (False: an EAGLE head only stores
    # their features; a later verify step catches the draft up, as after plain decode calls)
    draft_reads: bool = True
    drafts: np.ndarray | None = None  # [R, chunk - 1] int32 for a verify step (rows are chunks)
    num_drafts: np.ndarray | None = None  # [R] int32
    num_rounds: int = 1  # verify rounds one call may run (draft model, EAGLE head)
    capacity: np.ndarray | None = None  # [R] int32 positions the row's reserved pages hold (verify steps)
    draft_start: np.ndarray | None = None  # [R] int32 first position a draft model or head has not read
    window: np.ndarray | None = None  # [R, CATCH_UP_WINDOW] int32 each row's tokens from draft_start on
    # [P, ceil(V / 32)] int32 structured-output masks per sampled position (R, or R * chunk in a verify
    # step); None: every token allowed
    bitmask: np.ndarray | None = None
    # [T] int32 per flat token its row in its request's image rows (Request.image_rows), -1 for text;
    # None: no image placeholder in the step
    image_tokens: np.ndarray | None = None

    @property
    def shape(self) -> tuple[str, int, int]:
        """(program kind, tokens, rows): what selects the compiled program."""
        kind = "verify" if self.drafts is not None else "decode" if self.decode else "ragged"
        if kind == "ragged" and not self.draft_reads:
            kind = "ragged_unread"
        return kind, len(self.tokens), len(self.lengths)
