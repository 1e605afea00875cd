"""Each row slot's page table as the device holds it; a step ships only the entries that changed.

The engine's pages only grow while a request runs (a decode call adds one or two, a prefill chunk
a few) and are replaced whole when it is admitted again: so the device keeps a page table per row
slot (`row_state.RowState.page_tables`, [slots, W]) and a step sends (slot, column, page) triples
for what was added since, a fixed number per (tokens, rows) shape. When more changed than fit (a
prefix-cache hit brings many pages at once), the host's copy of every slot's table goes whole.
Host work and bytes per step are O(new pages), not O(rows x W). A new holder's entries overwrite
its slot's first columns only; the step also ships each row's page count, and the program reads
page 0 (the reserved sink) past it, so what an earlier holder left there is never touched.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def diff_capacity(num_tokens: int, num_rows: int, page_size: int) -> int:
    """Page entries one step of this shape ships: each row's tokens can open a page at each end."""
    return 2 * num_rows + num_tokens // page_size


class PageTables:
    """The host's copy of the device's per-slot page tables and which list each slot's came from."""

    def __init__(self, num_slots: int, width: int):
        self.table = np.zeros((num_slots, width), np.int32)
        self.known: dict[int, tuple[Any, int]] = {}  # slot -> (the pages list it mirrors, entries sent)

    def clear(self) -> None:
        """The device's tables were made anew (zeros)."""
        self.table[:] = 0
        self.known = {}

    def changes(self, slots: np.ndarray, pages: list[list[int] | None], capacity: int) -> np.ndarray | None:
        """[capacity, 3] int32 (slot, column, page) entries the rows' tables gained (padding: slot num_slots,
        out of range, dropped on the device), or
        None when more than capacity changed (then send `table` whole). slots [R]; pages: each row's list."""
        width = self.table.shape[1]
        entries: list[tuple[int, int, int]] = []
        for slot, row_pages in zip(slots.tolist(), pages):
            if row_pages is None:
                continue
            mirrored, sent = self.known.get(slot, (None, 0))
            if mirrored is not row_pages:  # a new holder, or the request's pages were replaced (readmitted)
                sent = 0
            new = row_pages[sent:width]
            if new:
                self.table[slot, sent : sent + len(new)] = new
                entries.extend((slot, sent + i, page) for i, page in enumerate(new))
            self.known[slot] = (row_pages, sent + len(new))
        if len(entries) > capacity:
            return None
        out = self.no_changes(capacity)
        if entries:
            out[: len(entries)] = entries
        return out

    def no_changes(self, capacity: int) -> np.ndarray:
        """[capacity, 3] entries that write nothing (slot num_slots is out of range: dropped)."""
        out = np.zeros((capacity, 3), np.int32)
        out[:, 0] = len(self.table)
        return out
