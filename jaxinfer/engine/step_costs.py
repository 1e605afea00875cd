"""What the engine's all-decode steps cost on this machine, timed as they run (host side, NumPy).

The speculation plan weighs a verify step against plain steps. In the engine they are not alike:
a plain call runs up to `decode_steps` steps on the device per return to the host, a verify step
with host drafts (prompt lookup) returns after one target pass over k_max + 1 tokens per row and
pays the host's scheduling, lookup and bookkeeping each time (device drafters run several rounds
per call: their time is recorded per round). The heuristic cost model (a verify pass costs one plain step)
misses both, and was measured speculating where it lost: adaptive n-gram at 0.6-0.9x of plain on
a CPU at batch 4. So the engine times every all-decode step, from scheduling to applied outputs,
per row bucket, and plans with those times once both kinds are known: round_base is a verify
step over a plain step (less the draft steps it ran), with no extra per verified token. The
host's share of a call (scheduling, inputs, applying outputs) is spread over the steps or rounds
the call was planned to run, the device's over those it ran: a measuring verify call runs one
round where the calls it prices run several, and charging it the whole host share priced a
draft model's rounds at batch 1 a plain step dearer than they run.

A one-round (measuring) call of a device drafter also pays the whole call's fixed cost (the
dispatch, the output read, a draft's catch-up) in its one round, so it overprices a round: the
first calls at a row bucket run every round (`needs_whole`) and, once two such calls are timed,
only calls that ran every round price a round.

The first time of each kind and bucket is dropped (it compiles when the engine was not warmed
up), and the fastest of the recent ones is used: load from other processes, or a compile for a
new page-table width, only ever slows a step down, so the minimum is the least disturbed time.
"""

from __future__ import annotations

import collections

import numpy as np

from jaxinfer.speculative.round_plan import CostModel

WINDOW = 8  # recent steps per kind and row bucket


def spread_host_share(seconds: float, device_seconds: float, ran: int, planned: int) -> float:
    """A call's seconds with its host share (all but device_seconds) spread over the `planned` steps
    or rounds a full call runs, of which it ran `ran`."""
    return device_seconds + (seconds - device_seconds) * ran / max(planned, ran)


class StepCosts:
    """Seconds of plain steps and verify steps per row bucket, and the cost model they imply."""

    def __init__(self, draft_cost: float):
        self.draft_cost = draft_cost  # draft steps relative to a plain step (0 for n-gram lookup)
        self._plain: dict[int, collections.deque] = {}
        self._verify: dict[int, collections.deque] = {}
        self._whole: dict[int, collections.deque] = {}  # verify calls that ran every round planned
        self._probe: dict[int, float] = {}  # seconds of the last one-round verify call, per row bucket

    def record_plain(self, rows: int, seconds: float, steps: int) -> None:
        """A plain call over `rows` (bucketed) rows that ran `steps` decode steps."""
        if steps > 0:
            _add(self._plain, rows, seconds / steps)

    def record_verify(self, rows: int, seconds: float, draft_steps: int, whole: bool = False) -> None:
        """A verify round over `rows` rows whose drafts took `draft_steps` draft-model steps; whole:
        its call ran every round a priced call runs (not a one-round measuring call)."""
        _add(self._verify, rows, (seconds, draft_steps))
        if whole:
            _add(self._whole, rows, (seconds, draft_steps))

    def needs_whole(self, rows: int) -> bool:
        """True until two verify calls at this row bucket ran every round (the first may compile)."""
        return not _ready(self._whole, rows)

    def record_probe(self, rows: int, seconds: float) -> None:
        """A verify call that ran one round (a measuring call: with a draft model or head, its
        catch-up on the positions decoded plainly included), whole."""
        self._probe[rows] = seconds

    def has_probe(self, rows: int) -> bool:
        """True once a measuring (or, before one, a whole) verify call at this row bucket is timed."""
        return rows in self._probe

    def probe_steps(self, rows: int) -> float | None:
        """The last measuring call at this row bucket in plain steps, or None until both are timed."""
        if rows not in self._probe or not _ready(self._plain, rows):
            return None
        return self._probe[rows] / min(list(self._plain[rows])[1:])

    def needs_plain(self, rows: int) -> bool:
        """True when verify steps at this row bucket are timed and plain steps not yet."""
        return _ready(self._verify, rows) and not _ready(self._plain, rows)

    def cost_model(self, rows: int) -> CostModel | None:
        """The measured cost model at this row bucket (NumPy), or None until both kinds are timed."""
        if not (_ready(self._plain, rows) and _ready(self._verify, rows)):
            return None
        plain = min(list(self._plain[rows])[1:])
        verify = self._whole if _ready(self._whole, rows) else self._verify
        seconds, draft_steps = min(list(verify[rows])[1:])
        base = max(seconds / plain - draft_steps * self.draft_cost, 1.0)
        pair = np.full((2,), base, np.float32)
        return CostModel(pair, np.full((2,), self.draft_cost, np.float32), np.float32(0.0))


def _add(times: dict[int, collections.deque], rows: int, value) -> None:
    times.setdefault(rows, collections.deque(maxlen=WINDOW + 1)).append(value)


def _ready(times: dict[int, collections.deque], rows: int) -> bool:
    """At least one time beyond the first (which may include a compile)."""
    return len(times.get(rows, ())) >= 2
