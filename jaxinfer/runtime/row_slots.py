"""Which row slot each request holds (host side; the slots' state lives on the device, see
`row_state`).

Every request in a step holds a slot, the index of its page table and, when its sampling needs
per-request state, of that state: repetition, presence and frequency penalties need every token
a request has seen, and `logit_bias` up to MAX_LOGIT_BIAS entries. Shipping them with each step
cost the host [rows, vocab] arrays (~40 MB at 64 rows and a 128k vocabulary) or [rows,
MAX_LOGIT_BIAS] ones (~150 KB a step); instead the device keeps them per slot, written once
when the request takes it (from its prompt and output ids and its bias: one small program,
O(sequence) once), and counts every kept token there.

A request keeps its slot while it runs, in a step or not (a prefill waiting for token budget, a
preempted request), so a recompute finds its counts as it left them; finished requests give
theirs back, and when a step needs more slots than are free, requests absent from it do too
(coming back, they are written again from their ids).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxinfer.config.sampling_params import MAX_LOGIT_BIAS


def holds_sampling_state(params: Any) -> bool:
    """Whether a request's sampling reads per-request device state (penalty counts, logit bias)."""
    return params.penalized or bool(params.logit_bias)


class RowSlots:
    """Slot 0 is the padding rows' (never written); 1..num_slots-1 are handed out."""

    def __init__(self, num_slots: int):
        self.free = list(range(num_slots - 1, 0, -1))
        self.held: dict[int, tuple[Any, int]] = {}  # id(request) -> (request, slot); the request is kept alive

    def assign(self, requests: list[Any]) -> tuple[np.ndarray, list[tuple[int, Any]]]:
        """(slot of each row [R], (slot, request) pairs that just took theirs) for a step's rows (None: padding)."""
        present = {id(r) for r in requests if r is not None}
        for key, (request, _) in list(self.held.items()):
            if key not in present and request.finished:
                self._give_back(key)
        wanted = len(present - self.held.keys())
        # Requests with nothing computed (preempted ones) give theirs first: one still prefilling in chunks
        # keeps its slot, where a Mamba2 layer's state for it lives (cache/state_pool).
        absent = sorted((k for k in self.held if k not in present), key=lambda k: self.held[k][0].num_computed > 0)
        for key in absent[: max(0, wanted - len(self.free))]:
            self._give_back(key)
        slots, fresh = np.zeros(len(requests), np.int32), []
        for i, request in enumerate(requests):
            if request is None:
                continue
            if id(request) not in self.held:
                self.held[id(request)] = (request, self.free.pop())
                fresh.append((self.held[id(request)][1], request))
            slots[i] = self.held[id(request)][1]
        return slots, fresh

    def _give_back(self, key: int) -> None:
        self.free.append(self.held.pop(key)[1])

    def clear(self) -> None:
        """Forget every holder (the device state was made anew)."""
        self.free = sorted(self.free + [slot for _, slot in self.held.values()], reverse=True)
        self.held = {}


def slot_ids(ids: list[int], width: int) -> np.ndarray:
    """ids as a [width] int32 array, -1 padded (a slot reset's fixed-shape input)."""
    out = np.full(width, -1, np.int32)
    out[: len(ids)] = ids
    return out


def bias_row(logit_bias: dict[int, float] | None) -> tuple[np.ndarray, np.ndarray]:
    """A request's logit_bias as (token ids [MAX_LOGIT_BIAS], -1 padded; biases [MAX_LOGIT_BIAS]): a slot
    reset's fixed-shape input."""
    ids, bias = np.full(MAX_LOGIT_BIAS, -1, np.int32), np.zeros(MAX_LOGIT_BIAS, np.float32)
    if logit_bias:
        ids[: len(logit_bias)] = list(logit_bias)
        bias[: len(logit_bias)] = list(logit_bias.values())
    return ids, bias
