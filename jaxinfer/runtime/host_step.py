"""One engine step as host (NumPy) arrays: what the engine's step builder makes and the runner runs.

Plain data, no jax: the engine builds it, `device_inputs` ships it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass
class HostStep:
    """NumPy fields of `engine_step.StepInputs` plus per-row sampling inputs: the runner's input contract."""

    tokens: np.ndarray
    positions: np.ndarray
    token_rows: np.ndarray
    page_table: np.ndarray
    lengths: np.ndarray
    query_lens: np.ndarray
    last_index: np.ndarray
    next_tokens: np.ndarray  # [N] the token after each flat token where known, else -1
    stop_ids: np.ndarray
    min_lengths: np.ndarray
    max_lengths: np.ndarray
    requests: list[Any]  # per row, the engine's request (None for padding); the runner never reads it
    num_decode: int
    num_steps: int
    drafts: np.ndarray | None = None  # [R, chunk - 1] int32 for a verify step (rows are chunks)
    num_drafts: np.ndarray | None = None  # [R] int32
    num_rounds: int = 1  # verify rounds one call may run (draft model, EAGLE head)
    capacity: np.ndarray | None = None  # [R] int32 positions the row's reserved pages hold (verify steps)
    history: np.ndarray | None = None  # [R, pages * page_size] int32 each row's tokens (verify steps)
    draft_start: np.ndarray | None = None  # [R] int32 first position a draft model or head has not read
    # [P, ceil(V / 32)] int32 structured-output masks per sampled position (R, or R * chunk in a verify
    # step); None: every token allowed
    bitmask: np.ndarray | None = None
