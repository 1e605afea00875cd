"""Serving metrics with vLLM's names and meanings (host side, no jax).

Latencies are kept per finished request and summarized (mean, p50, p99); counters are totals
since the engine started; gauges are read at call time.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from jaxinfer.engine.request import Request


@dataclasses.dataclass
class EngineMetrics:
    """Totals and per-request latency samples."""

    time_to_first_token: list[float] = dataclasses.field(default_factory=list)
    time_per_output_token: list[float] = dataclasses.field(default_factory=list)
    inter_token_latency: list[float] = dataclasses.field(default_factory=list)
    e2e_latency: list[float] = dataclasses.field(default_factory=list)
    queue_time: list[float] = dataclasses.field(default_factory=list)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: dict[str, int] = dataclasses.field(default_factory=dict)
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] = dataclasses.field(default_factory=list)
    # Where engine time goes (jaxinfer's own, not vLLM's): device calls, the seconds of step()
    # calls that ran one, and of those the wait for the device's outputs; the rest is host work
    # (scheduling, step arrays, dispatch, detokenizing, outputs) that the device does not overlap.
    engine_steps: int = 0
    engine_step_seconds: float = 0.0
    engine_device_wait_seconds: float = 0.0
    # The same seconds by phase (StepClock.PHASES), to tell which host work a step waits on.
    engine_phase_seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    def record_finished(self, request: Request) -> None:
        """Fold one finished sample's timings into the samples."""
        t = request.timing
        self.requests_finished[request.finish_reason] = self.requests_finished.get(request.finish_reason, 0) + 1
        self.prompt_tokens += len(request.prompt_ids)
        self.generation_tokens += len(request.output_ids)
        if t.first_scheduled is not None:
            self.queue_time.append(t.first_scheduled - t.arrival)
        if t.first_token is None or t.finished is None:
            return
        self.time_to_first_token.append(t.first_token - t.arrival)
        self.e2e_latency.append(t.finished - t.arrival)
        self.inter_token_latency += t.token_gaps
        if len(request.output_ids) > 1 and t.last_token is not None:
            self.time_per_output_token.append((t.last_token - t.first_token) / (len(request.output_ids) - 1))


    def record_drafts(self, drafted: np.ndarray, accepted: np.ndarray, k_max: int) -> None:
        """Count one verify step: rows that drafted, their draft tokens, and acceptances per position."""
        if len(self.spec_accepted_per_position) < k_max:
            self.spec_accepted_per_position += [0] * (k_max - len(self.spec_accepted_per_position))
        self.spec_drafts += int(np.count_nonzero(drafted))
        self.spec_draft_tokens += int(drafted.sum())
        self.spec_accepted_tokens += int(accepted.sum())
        for i in range(k_max):
            self.spec_accepted_per_position[i] += int(np.count_nonzero(accepted > i))

    def record_step(self, clock: StepClock) -> None:
        """One step() call that ran the device, by phase; the device's share is its call and outputs."""
        self.engine_steps += 1
        self.engine_step_seconds += sum(clock.laps.values())
        self.engine_device_wait_seconds += sum(clock.laps.get(phase, 0.0) for phase in StepClock.DEVICE)
        for phase, seconds in clock.laps.items():
            self.engine_phase_seconds[phase] = self.engine_phase_seconds.get(phase, 0.0) + seconds


class StepClock:
    """One step() call's wall time split into phases as it goes: each `lap` ends one.

    schedule (the scheduler), build (the host step arrays), inputs (device inputs made and
    moved), dispatch (the program called; on a GPU this drives a multi-step loop, reading each
    iteration's continue-test), outputs (waiting for the outputs and reading them back), apply
    (tokens appended, detokenized, finished requests freed), collect (RequestOutputs built).
    """

    PHASES = ("schedule", "build", "inputs", "dispatch", "outputs", "apply", "collect")
    DEVICE = ("dispatch", "outputs")

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        """The time since the last lap (or the start) goes to `phase`."""
        now = time.perf_counter()
        self.laps[phase] = self.laps.get(phase, 0.0) + now - self._last
        self._last = now


def summary(values: list[float]) -> dict[str, float]:
    """count, mean, p50 and p99 of a latency list (NaN when empty)."""
    if not values:
        return {"count": 0, "mean": float("nan"), "p50": float("nan"), "p99": float("nan")}
    arr = np.asarray(values)
    return {
        "count": len(values),
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p99": float(np.percentile(arr, 99)),
    }


def snapshot(m: EngineMetrics, running: int, waiting: int, kv_usage: float, prefix: tuple[int, int], preemptions: int) -> dict:
    """All metrics as one dict, keyed by vLLM's metric names (without the `vllm:` prefix)."""
    return {
        "num_requests_running": running,
        "num_requests_waiting": waiting,
        "kv_cache_usage_perc": kv_usage,
        "prefix_cache_queries": prefix[0],
        "prefix_cache_hits": prefix[1],
        "num_preemptions": preemptions,
        "prompt_tokens": m.prompt_tokens,
        "generation_tokens": m.generation_tokens,
        "request_success": dict(m.requests_finished),
        "time_to_first_token_seconds": summary(m.time_to_first_token),
        "time_per_output_token_seconds": summary(m.time_per_output_token),
        "inter_token_latency_seconds": summary(m.inter_token_latency),
        "e2e_request_latency_seconds": summary(m.e2e_latency),
        "request_queue_time_seconds": summary(m.queue_time),
        "spec_decode_num_drafts": m.spec_drafts,
        "spec_decode_num_draft_tokens": m.spec_draft_tokens,
        "spec_decode_num_accepted_tokens": m.spec_accepted_tokens,
        "spec_decode_num_accepted_tokens_per_pos": list(m.spec_accepted_per_position),
        "engine_steps": m.engine_steps,
        "engine_step_seconds": m.engine_step_seconds,
        "engine_device_wait_seconds": m.engine_device_wait_seconds,
        "engine_phase_seconds": dict(m.engine_phase_seconds),
    }
