"""What a landed call tells the engine's speculation: acceptance per row and round, and the time
of a plain decode step or a verify round for the plan's cost model (host side, no jax)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from jaxinfer.engine.metrics import EngineMetrics
from jaxinfer.engine.scheduler import Schedule
from jaxinfer.engine.speculation import Speculator
from jaxinfer.engine.step_accounting import decode_iterations, ran_rounds
from jaxinfer.engine.step_costs import spread_host_share
from jaxinfer.runtime.host_step import HostStep

if TYPE_CHECKING:
    from jaxinfer.runtime.engine_step import StepOutputs


@dataclasses.dataclass(frozen=True)
class DecodeTime:
    """An all-decode call's timing and what shaped it."""

    rows: int  # its row bucket
    seconds: float  # scheduling to applied outputs
    device_seconds: float  # of those, the dispatch and the wait for its outputs
    stop_early: bool  # the runner's loops end when every row finished (CPU) or run their trip count
    spec_rounds: int  # verify rounds a priced call runs
    draft_model: bool  # a draft model or EAGLE head drafts (its draft steps are part of a round's cost)


def observe_drafts(
    speculator: Speculator, stats: EngineMetrics, schedule: Schedule, host: HostStep, out: "StepOutputs"
) -> None:
    """Acceptance per row and round into the speculator and the vLLM-named counters (a device lookup's
    rounds are scored against the drafts planned, which it may not have found)."""
    rows = len(schedule.decodes)
    requests = [row.request for row in schedule.decodes]
    looked_up = speculator.config.looks_up_on_device
    for i in range(ran_rounds(out)):
        drafted, accepted = np.maximum(out.drafted[:rows, i], 0), np.asarray(out.accepted[:rows, i])
        ran = np.asarray(out.drafted[:rows, i]) >= 0
        planned = np.where(ran, host.num_drafts[:rows], 0) if looked_up else None
        speculator.observe(requests, drafted, accepted, planned)
        stats.record_drafts(drafted, accepted, speculator.k_max)


def record_decode_time(speculator: Speculator, host: HostStep, out: "StepOutputs", time: DecodeTime) -> None:
    """An all-decode call's time for the speculation plan, per decode step or verify round.

    The host's share is spread over the steps or rounds the call was planned to run: a measuring
    verify call runs one round, the ones it prices run spec_rounds.
    """
    plain = host.drafts is None
    ran = decode_iterations(host, out, time.stop_early) if plain else ran_rounds(out)
    if plain:
        speculator.count_plain(time.rows, ran)
    if speculator.measured is None:
        return
    planned = host.num_steps if plain else time.spec_rounds
    seconds = spread_host_share(time.seconds, time.device_seconds, ran, planned)
    if plain:
        speculator.measured.record_plain(time.rows, seconds, ran)
    else:
        draft_steps = int(np.max(host.num_drafts)) if time.draft_model else 0
        speculator.measured.record_verify(time.rows, seconds / ran, draft_steps, host.num_rounds == time.spec_rounds)
        # A reprobe runs one round; until one is timed, a whole call's time bounds what it costs
        # (the first calls at a row bucket run every round: `StepCosts.needs_whole`).
        if host.num_rounds == 1 or not speculator.measured.has_probe(time.rows):
            speculator.measured.record_probe(time.rows, time.seconds)
