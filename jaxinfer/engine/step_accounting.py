"""What a device call actually ran, read from its outputs: decode iterations, verify rounds, and
the token positions computed against those scheduled (the padding counters). Host only, no jax."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from jaxinfer.engine.scheduler import Schedule
from jaxinfer.runtime.host_step import HostStep

if TYPE_CHECKING:
    from jaxinfer.runtime.engine_step import StepOutputs


def ran_rounds(out: "StepOutputs") -> int:
    """Verify rounds a call ran (every live row runs each round; padding rows record -1)."""
    return int(np.count_nonzero(np.max(out.drafted, axis=0) >= 0)) or 1


def decode_iterations(host: HostStep, out: "StepOutputs", stop_early: bool) -> int:
    """Steps a multi-step decode call ran: to the first finished row, or all of them (fixed trips)."""
    return int(np.max(out.counts)) if stop_early else host.num_steps


def token_slots(schedule: Schedule, host: HostStep, out: "StepOutputs", stop_early: bool,
                verify_chunk: int) -> tuple[int, int]:
    """(token positions the call computed, scheduled ones): a decode call runs until a row finishes
    (or all its iterations where calls do not stop early), verify rounds over every chunk slot."""
    rows = schedule.decodes + schedule.prefills
    if host.drafts is not None:
        rounds = ran_rounds(out)
        return len(host.tokens) * rounds, len(rows) * verify_chunk * rounds
    if host.decode:
        return len(host.tokens) * decode_iterations(host, out, stop_early), int(np.sum(out.counts))
    return len(host.tokens), sum(row.count for row in rows)
