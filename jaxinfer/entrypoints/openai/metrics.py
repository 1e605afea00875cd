"""GET /metrics: the engine's metrics() in Prometheus text, named like vLLM's under `jaxinfer:`.

A custom collector reads `engine.metrics()` at scrape time, so the numbers are the engine's
own; nothing is double counted in the server. Latencies are histograms with vLLM's bucket
boundaries (the engine keeps the counts), so `histogram_quantile(0.99, rate(..._bucket[5m]))`
works as it does on vLLM.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

PREFIX = "jaxinfer:"
GAUGES = {
    "num_requests_running": "Requests in the running batch.",
    "num_requests_waiting": "Requests waiting to be scheduled.",
    "kv_cache_usage_perc": "Fraction of KV-cache pages in use (1 = full).",
    "device_memory_bytes_in_use": "Bytes JAX's allocators hold on this process's devices (absent on CPU).",
    "kv_offload_store_bytes": "Bytes of evicted KV pages the host tier holds (KV offloading).",
    "kv_offload_store_capacity_bytes": "Bytes the host tier may hold (--kv-offloading-size).",
}
# exported only where the engine reports them (offloading's where it is on)
OPTIONAL = {"device_memory_bytes_in_use", "kv_offload_store_bytes", "kv_offload_store_capacity_bytes"}
COUNTERS = {  # prometheus_client adds the `_total` suffix
    "prefix_cache_queries": "Prompt tokens of admitted requests looked up in the prefix cache.",
    "prefix_cache_hits": "Prompt tokens of admitted requests found in the prefix cache.",
    "num_preemptions": "Requests preempted (to be recomputed).",
    "prompt_tokens": "Prompt tokens of requests that produced a first token.",
    "generation_tokens": "Generated tokens.",
    "spec_decode_num_drafts": "Speculative draft rounds.",
    "spec_decode_num_draft_tokens": "Speculative tokens drafted.",
    "spec_decode_num_accepted_tokens": "Speculative tokens accepted.",
    "engine_steps": "Engine steps that ran a device call.",
    "engine_step_seconds": "Wall seconds of those steps.",
    "engine_device_wait_seconds": "Of those, seconds in device calls and their outputs (the rest is host work).",
    "engine_overlapped_seconds": "Of the host work, seconds done while a device call ran (output processing).",
    "engine_token_slots": "Token positions device calls computed, padding included.",
    "engine_real_tokens": "Of those, the scheduled ones (padding waste: slots / real - 1).",
    "engine_input_bytes": "Bytes of step inputs sent to the device (host to device).",
    "engine_chained_calls": "Decode and verify calls started before the call ahead of them landed (async scheduling).",
    "engine_chained_verify_calls": "Of those, verify calls (speculative; the device drafts).",
    "compiled_programs": "Programs compiled or loaded from the compilation cache in this process (JAX's events).",
    "lora_slot_loads": "LoRA adapters written into a device slot (a swap when every slot held another).",
    "kv_offload_stored_pages": "KV pages evicted from the device pool and copied to the host tier.",
    "kv_offload_stored_bytes": "Bytes of those pages.",
    "kv_offload_loaded_pages": "KV pages found in the host tier and copied back (host-tier prefix hits).",
    "kv_offload_loaded_bytes": "Bytes of those pages.",
}
SHADOW_COUNTERS = {
    "requests": "Requests shadowed on the reference and scored.",
    "mismatches": "Shadowed requests whose greedy output (or a teacher-forced argmax) differed from the reference.",
    "dropped": "Requests sampled for shadowing but dropped (backlog full, or no output).",
    "errors": "Shadow runs that failed (serving is unaffected).",
}
HISTOGRAMS = {
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": "Histogram of time per output token after the first, per request.",
    "e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "request_queue_time_seconds": "Histogram of arrival to first schedule of a request in seconds.",
}


def _histogram(name: str, doc: str, values: dict) -> Metric:
    buckets = [(floatToGoString(bound), count) for bound, count in values["buckets"]]
    return HistogramMetricFamily(PREFIX + name, doc, buckets=buckets, sum_value=values["sum"])


def _lora_info(info: dict) -> Metric:
    """vLLM's lora_requests_info: the adapters running and waiting as labels, the time as the value."""
    family = GaugeMetricFamily(PREFIX + "lora_requests_info", "LoRA adapters of running and waiting requests.",
                               labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
    family.add_metric([str(info["max_lora"]), ",".join(info["running"]), ",".join(info["waiting"])], time.time())
    return family


class EngineCollector(Collector):
    """Turns one metrics() snapshot into Prometheus metric families."""

    def __init__(self, read: Callable[[], dict]):
        self.read = read

    def collect(self) -> Iterator[Metric]:
        """Every metric of one snapshot."""
        snapshot = self.read()
        for name, doc in GAUGES.items():
            if name in snapshot or name not in OPTIONAL:
                yield GaugeMetricFamily(PREFIX + name, doc, value=float(snapshot.get(name, 0)))
        for name, doc in COUNTERS.items():
            yield CounterMetricFamily(PREFIX + name, doc, value=float(snapshot.get(name, 0)))
        per_position = CounterMetricFamily(
            PREFIX + "spec_decode_num_accepted_tokens_per_pos",
            "Speculative rounds whose draft token at this position was accepted.",
            labels=["position"],
        )
        for position, count in enumerate(snapshot.get("spec_decode_num_accepted_tokens_per_pos", [])):
            per_position.add_metric([str(position)], float(count))
        yield per_position
        success = CounterMetricFamily(PREFIX + "request_success", "Finished requests by reason.", labels=["finished_reason"])
        for reason, count in sorted(snapshot.get("request_success", {}).items()):
            success.add_metric([str(reason)], float(count))
        yield success
        if (lora := snapshot.get("lora_requests_info")) is not None:
            yield _lora_info(lora)
        phases = CounterMetricFamily(PREFIX + "engine_phase_seconds", "Seconds of engine steps by phase (see "
                                     "engine.metrics.StepClock).", labels=["phase"])
        for phase, seconds in sorted(snapshot.get("engine_phase_seconds", {}).items()):
            phases.add_metric([phase], seconds)
        yield phases
        for name, doc in HISTOGRAMS.items():
            if name in snapshot:
                yield _histogram(name, doc, snapshot[name])


class FallbackCollector(Collector):
    """Fallback gauges per optimization and, with shadow validation, its counters and histograms."""

    def __init__(self, states: Callable[[], dict], shadow: Callable[[], dict] | None = None):
        self.states, self.shadow = states, shadow

    def collect(self) -> Iterator[Metric]:
        """fallback_active / fallback_cause, then the shadow_* families when shadowing."""
        active = GaugeMetricFamily(PREFIX + "fallback_active", "1 while the optimization runs on the reference "
                                   "path (switched off or routed away), else 0.", labels=["optimization"])
        cause = GaugeMetricFamily(PREFIX + "fallback_cause", "1 for why an active fallback is on (shadow_mismatch, "
                                  "low_agreement, error, does_not_pay, load_failed, disabled).",
                                  labels=["optimization", "cause"])
        for name, state in sorted(self.states().items()):
            active.add_metric([name], float(state is not None))
            if state is not None:
                cause.add_metric([name, state[0]], 1.0)
        yield active
        yield cause
        if self.shadow is not None:
            yield from _shadow_families(self.shadow())


def _shadow_families(snapshot: dict) -> Iterator[Metric]:
    """shadow_requests_total, _mismatches_total, _dropped_total, _errors_total, _agreement{kind}, _kl."""
    for name, doc in SHADOW_COUNTERS.items():
        yield CounterMetricFamily(PREFIX + "shadow_" + name, doc, value=float(snapshot[name]))
    agreement = HistogramMetricFamily(PREFIX + "shadow_agreement", "Per shadowed request: greedy, the fraction of "
                                      "output positions equal to the reference's; top1, the fraction whose argmax "
                                      "the reference shares under teacher forcing.", labels=["kind"])
    for kind, values in snapshot["agreement"].items():
        agreement.add_metric([kind], [(floatToGoString(b), c) for b, c in values["buckets"]], values["sum"])
    yield agreement
    yield _histogram("shadow_kl", "Per shadowed request: mean KL(reference || served) per output token, nats.",
                     snapshot["kl"])


def metrics_text(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text exposition format."""
    return generate_latest(registry)


def engine_registry(read: Callable[[], dict], fallback: FallbackCollector | None = None) -> CollectorRegistry:
    """A registry of its own per app (the global one would mix servers in one process, e.g. tests)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(read))
    if fallback is not None:
        registry.register(fallback)
    return registry
