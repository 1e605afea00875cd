"""A device call one `LLMEngine.step` started and the next lands (EngineConfig.overlap_outputs)."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxinfer.engine.scheduler import Schedule
from jaxinfer.runtime.host_step import HostStep


@dataclasses.dataclass
class InFlight:
    """What landing the call needs: its plan, its outputs still on the device, and its timing."""

    schedule: Schedule
    host: HostStep
    packed: Any  # the call's outputs on the device; the runner's `read` waits for them
    started: float  # perf_counter before the step was built: the call's time runs from here to applied
    dispatch_seconds: float  # its dispatch lap; with the wait for its outputs, its device time
    carried: bool = False  # started before the call ahead of it landed: its rows' positions are placeholders
    measuring: bool = False  # a verify call measuring acceptance: the next plan waits for what it measures
