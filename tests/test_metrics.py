"""Engine metrics (host side, no jax): bounded histograms with vLLM's buckets, counters that only grow."""

from __future__ import annotations

import math
import pickle

from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.metrics import TTFT_BUCKETS, EngineMetrics, Histogram
from jaxinfer.engine.request import Request


def test_histogram_counts_each_value_under_its_upper_bound_cumulatively():
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 7.0):
        histogram.observe(value)
    assert histogram.snapshot() == {"count": 5, "sum": 8.65, "buckets": [(0.1, 2), (1.0, 4), (math.inf, 5)]}


def finished_request(i: int) -> Request:
    """A finished sample of 64 tokens, 10 ms apart, that waited 1 ms."""
    request = Request(f"r{i}", 0, None, [3, 4, 5], SamplingParams(max_tokens=64), 0, ())
    t = request.timing
    t.arrival, t.first_scheduled = 100.0, 100.001
    for j in range(64):
        request.output_ids.append(7)
        t.record_tokens(1, 100.05 + 0.01 * j)
    request.finish("length")
    t.finished = t.last_token
    return request


def test_metrics_stay_the_same_size_however_many_requests_finish():
    few, many = EngineMetrics(), EngineMetrics()
    for i in range(10):
        few.record_finished(finished_request(i))
    for i in range(2000):
        many.record_finished(finished_request(i))
    assert len(pickle.dumps(many)) <= len(pickle.dumps(few)) + 64  # a few counters' wider integers
    assert many.requests_finished == {"length": 2000} and many.e2e_latency.snapshot()["count"] == 2000


def test_tokens_are_observed_as_they_come():
    metrics, request = EngineMetrics(), Request("r", 0, None, [3, 4, 5], SamplingParams(max_tokens=8), 0, ())
    request.timing.arrival = 10.0
    metrics.record_tokens(request, 1, 10.03)  # the first token: TTFT now, not when the request ends
    metrics.record_tokens(request, 4, 10.23)  # a 4-step call: four gaps of 0.05
    ttft, gaps = metrics.time_to_first_token.snapshot(), metrics.inter_token_latency.snapshot()
    assert ttft["count"] == 1 and ttft["sum"] == 10.03 - 10.0 and ttft["buckets"][TTFT_BUCKETS.index(0.04)][1] == 1
    assert gaps["count"] == 4 and math.isclose(gaps["sum"], 0.2)
    assert metrics.generation_tokens == 5 and metrics.prompt_tokens == 3
