"""Which sampling slot each request holds (host side; the slots' state lives on the device, see
`sampling.slot_state`).

Repetition, presence and frequency penalties need every token a request has seen, and
`logit_bias` up to MAX_LOGIT_BIAS entries. Shipping them with each step cost the host [rows,
vocab] arrays (~40 MB at 64 rows and a 128k vocabulary) or [rows, MAX_LOGIT_BIAS] ones (~150 KB
a step); instead the device keeps a `SlotState` that the step programs read (and update with
each kept token), and a request that needs it gets a slot the first time it samples: the slot is
reset from its prompt and output ids and its bias (one small program, O(sequence) once). A
request that leaves the step's sampling rows (finished, aborted, preempted) gives its slot back;
coming back, it is reset again from its ids, so a recompute keeps the counts exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def holds_slot(params: Any) -> bool:
    """Whether a request's sampling reads per-request device state (penalty counts, logit bias)."""
    return params.penalized or bool(params.logit_bias)


class SamplingSlots:
    """Slot 0 is every row's that needs none (never read, never written); 1..num_slots-1 are handed out."""

    def __init__(self, num_slots: int):
        self.free = list(range(num_slots - 1, 0, -1))
        self.held: dict[int, tuple[Any, int]] = {}  # id(request) -> (request, slot); the request is kept alive

    def assign(self, requests: list[Any], samples: np.ndarray) -> tuple[np.ndarray, list[tuple[int, Any]]]:
        """(slot of each row [R], (slot, request) pairs to reset before the step) for a step's rows."""
        wanted = {id(r): r for r, kept in zip(requests, samples) if r is not None and kept and holds_slot(r.params)}
        for key in [k for k in self.held if k not in wanted]:
            self.free.append(self.held.pop(key)[1])
        slots, fresh = np.zeros(len(requests), np.int32), []
        for i, request in enumerate(requests):
            if id(request) not in wanted:
                continue
            if id(request) not in self.held:
                self.held[id(request)] = (request, self.free.pop())
                fresh.append((self.held[id(request)][1], request))
            slots[i] = self.held[id(request)][1]
        return slots, fresh

    def clear(self) -> None:
        """Forget every holder (the counts were made anew)."""
        self.free = sorted(self.free + [slot for _, slot in self.held.values()], reverse=True)
        self.held = {}


def slot_ids(ids: list[int], width: int) -> np.ndarray:
    """ids as a [width] int32 array, -1 padded (a slot reset's fixed-shape input)."""
    out = np.full(width, -1, np.int32)
    out[: len(ids)] = ids
    return out
