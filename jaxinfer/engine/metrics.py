"""Serving metrics with vLLM's names and meanings (host side, no jax).

Counters only grow for the life of the engine; latencies go into histograms with vLLM's bucket
boundaries, fixed memory however long the engine serves; gauges are read at call time. The
server exports them as Prometheus counters and histograms (entrypoints/openai/metrics.py); the engine
keeps its own small histogram rather than prometheus_client's, which is the `serve` extra's.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import time
from typing import Sequence

import numpy as np

from jaxinfer.engine.request import Request

# vLLM's boundaries (vllm/v1/metrics/loggers.py), so dashboards made for vLLM read these as they are.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)
TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)


class Histogram:
    """Counts per bucket plus their sum: a latency distribution in fixed memory (Prometheus' histogram)."""

    def __init__(self, bounds: Sequence[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last counts values above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count value in the first bucket whose upper bound is >= value (Prometheus' `le`)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def snapshot(self) -> dict:
        """count, sum, and (upper bound, observations <= it) pairs ending with (inf, count)."""
        cumulative = list(itertools.accumulate(self.counts))
        return {"count": cumulative[-1], "sum": self.sum, "buckets": list(zip(self.bounds + (math.inf,), cumulative))}


def _histogram(bounds: Sequence[float]) -> dataclasses.Field:
    return dataclasses.field(default_factory=lambda: Histogram(bounds))


@dataclasses.dataclass
class EngineMetrics:
    """Totals since the engine started and latency histograms (vLLM's names and buckets)."""

    time_to_first_token: Histogram = _histogram(TTFT_BUCKETS)
    inter_token_latency: Histogram = _histogram(TOKEN_BUCKETS)
    request_time_per_output_token: Histogram = _histogram(TOKEN_BUCKETS)
    e2e_latency: Histogram = _histogram(REQUEST_BUCKETS)
    queue_time: Histogram = _histogram(REQUEST_BUCKETS)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: dict[str, int] = dataclasses.field(default_factory=dict)
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] = dataclasses.field(default_factory=list)  # k_max long
    # Where engine time goes (jaxinfer's own, not vLLM's): device calls, the seconds of step()
    # calls that ran one, and of those the wait for the device's outputs; the rest is host work
    # (scheduling, step arrays, dispatch, detokenizing, outputs) that the device does not overlap.
    engine_steps: int = 0
    engine_step_seconds: float = 0.0
    engine_device_wait_seconds: float = 0.0
    engine_overlapped_seconds: float = 0.0  # host work done while a device call ran (overlap_outputs)
    # The same seconds by phase (StepClock.PHASES), to tell which host work a step waits on.
    engine_phase_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    # Token positions the device computed (padding included: tokens x iterations of each call) and
    # of those the scheduled ones: padding waste is their ratio less one.
    engine_token_slots: int = 0
    engine_real_tokens: int = 0
    engine_input_bytes: int = 0  # step inputs copied host -> device (weights, pools and counts stay there)
    engine_chained_calls: int = 0  # device calls started before the call ahead of them landed (async_scheduling)
    engine_chained_verify_calls: int = 0  # of those, verify calls (the device drafts: runtime/verify_carry)

    def record_tokens(self, request: Request, count: int, now: float) -> None:
        """A sample's `count` new tokens at `now`, observed as they come (a dashboard sees a long
        request's first token when it happens, not when the request ends)."""
        t = request.timing
        had_first, known_gaps = t.first_token is not None, len(t.token_gaps)
        t.record_tokens(count, now)
        if count <= 0:
            return
        self.generation_tokens += count
        if not had_first:
            self.prompt_tokens += len(request.prompt_ids)
            self.time_to_first_token.observe(t.first_token - t.arrival)
        for gap in t.token_gaps[known_gaps:]:
            self.inter_token_latency.observe(gap)

    def record_finished(self, request: Request) -> None:
        """Count one finished sample and observe its per-request latencies."""
        t = request.timing
        self.requests_finished[request.finish_reason] = self.requests_finished.get(request.finish_reason, 0) + 1
        if t.first_scheduled is not None:
            self.queue_time.observe(t.first_scheduled - t.arrival)
        if t.first_token is None or t.finished is None:
            return
        self.e2e_latency.observe(t.finished - t.arrival)
        if len(request.output_ids) > 1 and t.last_token is not None:
            self.request_time_per_output_token.observe((t.last_token - t.first_token) / (len(request.output_ids) - 1))

    def record_drafts(self, drafted: np.ndarray, accepted: np.ndarray, k_max: int) -> None:
        """Count one verify step: rows that drafted, their draft tokens, and acceptances per position."""
        if len(self.spec_accepted_per_position) < k_max:
            self.spec_accepted_per_position += [0] * (k_max - len(self.spec_accepted_per_position))
        self.spec_drafts += int(np.count_nonzero(drafted))
        self.spec_draft_tokens += int(drafted.sum())
        self.spec_accepted_tokens += int(accepted.sum())
        for i in range(k_max):
            self.spec_accepted_per_position[i] += int(np.count_nonzero(accepted > i))

    def record_padding(self, slots: int, real: int) -> None:
        """One device call's token positions computed (slots) and scheduled (real)."""
        self.engine_token_slots += slots
        self.engine_real_tokens += real

    def record_inputs(self, nbytes: int) -> None:
        """One device call's input bytes sent from the host."""
        self.engine_input_bytes += nbytes

    def record_step(self, clock: StepClock) -> None:
        """One step() call that ran the device, by phase; the device's share is its call and outputs."""
        self.engine_steps += 1
        self.engine_step_seconds += sum(clock.laps.values())
        self.engine_device_wait_seconds += sum(clock.laps.get(phase, 0.0) for phase in StepClock.DEVICE)
        self.engine_overlapped_seconds += clock.host_overlapped()
        for phase, seconds in clock.laps.items():
            self.engine_phase_seconds[phase] = self.engine_phase_seconds.get(phase, 0.0) + seconds


class StepClock:
    """One step() call's wall time split into phases as it goes: each `lap` ends one.

    schedule (the scheduler), build (the host step arrays), inputs (device inputs made and
    moved), dispatch (the program called; on a GPU this drives a multi-step loop, reading each
    iteration's continue-test), outputs (waiting for the outputs and reading them back), apply
    (tokens appended, finished requests freed), collect (text detokenized, RequestOutputs built), or
    overlapped (the same while the next device call runs: overlap_outputs). In a `chained` step
    (async_scheduling: the next call was started before this step landed the one ahead) the device
    always had a call, so all the host's phases ran beside it: they count as overlapped.
    """

    PHASES = ("schedule", "build", "inputs", "dispatch", "outputs", "apply", "collect", "overlapped")
    DEVICE = ("dispatch", "outputs")

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self.chained = False
        self._last = time.perf_counter()

    def host_overlapped(self) -> float:
        """Seconds of host work the device did not wait for."""
        if self.chained:
            return sum(seconds for phase, seconds in self.laps.items() if phase not in self.DEVICE)
        return self.laps.get("overlapped", 0.0)

    def lap(self, phase: str) -> None:
        """The time since the last lap (or the start) goes to `phase`."""
        now = time.perf_counter()
        self.laps[phase] = self.laps.get(phase, 0.0) + now - self._last
        self._last = now


def snapshot(
    m: EngineMetrics, running: int, waiting: int, kv_usage: float, prefix: tuple[int, int], preemptions: int
) -> dict:
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
        "time_to_first_token_seconds": m.time_to_first_token.snapshot(),
        "inter_token_latency_seconds": m.inter_token_latency.snapshot(),
        "request_time_per_output_token_seconds": m.request_time_per_output_token.snapshot(),
        "e2e_request_latency_seconds": m.e2e_latency.snapshot(),
        "request_queue_time_seconds": m.queue_time.snapshot(),
        "spec_decode_num_drafts": m.spec_drafts,
        "spec_decode_num_draft_tokens": m.spec_draft_tokens,
        "spec_decode_num_accepted_tokens": m.spec_accepted_tokens,
        "spec_decode_num_accepted_tokens_per_pos": list(m.spec_accepted_per_position),
        "engine_steps": m.engine_steps,
        "engine_step_seconds": m.engine_step_seconds,
        "engine_device_wait_seconds": m.engine_device_wait_seconds,
        "engine_overlapped_seconds": m.engine_overlapped_seconds,
        "engine_phase_seconds": dict(m.engine_phase_seconds),
        "engine_token_slots": m.engine_token_slots,
        "engine_real_tokens": m.engine_real_tokens,
        "engine_input_bytes": m.engine_input_bytes,
        "engine_chained_calls": m.engine_chained_calls,
        "engine_chained_verify_calls": m.engine_chained_verify_calls,
    }
