"""Engine knobs, validated with errors that name the knob to turn (host side, no jax)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of an accelerator's memory
SCHEDULING_POLICIES = ("fcfs", "priority")  # vLLM's names


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """How much the engine runs at once and how much KV memory it keeps.

    num_pages None sizes the pool on accelerators to fill gpu_memory_utilization (None: 0.9) of
    the device's memory after the weights and a step's activations (`device_pages`), and on CPU,
    which reports no device memory, to hold half of max_num_seqs sequences at max_seq_len (pages
    are only used as tokens arrive).
    """

    max_seq_len: int
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    # Prompts that prefill in one step; None: as many as max_num_seqs and the token budget allow
    # (vLLM's behaviour). A burst of short prompts then gets its first tokens in a step or two.
    max_prefill_seqs: int | None = None
    num_pages: int | None = None
    gpu_memory_utilization: float | None = None
    page_size: int = 16
    enable_prefix_caching: bool = True
    decode_steps: int = 8
    # Decode steps a call may run while a streamed request is in the batch; None: as many as fit
    # in STREAM_BURST_SECONDS at the measured step time (up to decode_steps).
    stream_interval: int | None = None
    # step() dispatches the next device call before it turns the last one's tokens into outputs, so
    # the device runs while the host detokenizes, builds outputs and the caller handles them; each
    # step() then returns the outputs of the call before it. False: a call's outputs from its own step().
    overlap_outputs: bool = True
    # With overlap_outputs: a multi-step decode call whose rows go on decoding has the next one
    # started behind it before it lands, on the tokens and lengths the device carries (vLLM's
    # async_scheduling), so the device does not wait while the host lands, schedules and builds.
    async_scheduling: bool = True
    # GiB of host memory keeping prefix pages the device pool evicts (vLLM's kv_offloading_size): a later
    # prompt that starts with them copies them back instead of recomputing. None or 0: off.
    kv_offloading_size: float | None = None
    # vLLM's engine seed: requests that give no seed draw theirs from one stream seeded by it, so sampled
    # outputs repeat from run to run (`engine/request_seeds`). None: a fresh random seed per request.
    seed: int | None = None
    # vLLM's: "fcfs" serves requests in arrival order; "priority" by each request's priority (lower first),
    # then arrival, and preempts the last in that order when pages run out.
    scheduling_policy: str = "fcfs"

    def __post_init__(self) -> None:
        for name in ("max_seq_len", "max_num_seqs", "max_num_batched_tokens", "max_prefill_seqs", "decode_steps",
                     "stream_interval"):
            value = getattr(self, name)
            if name in ("stream_interval", "max_prefill_seqs") and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be an integer >= 0 or None (a random seed per request), got {self.seed!r}")
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size!r}")
        if self.num_pages is not None and (not isinstance(self.num_pages, int) or self.num_pages < 2):
            raise ValueError(f"num_pages must be an integer >= 2 (or None for automatic), got {self.num_pages!r}")
        fraction = self.gpu_memory_utilization
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {fraction!r}")
        check_offloading(self.kv_offloading_size, self.enable_prefix_caching)
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(map(repr, SCHEDULING_POLICIES))}, "
                             f"got {self.scheduling_policy!r}")

    @property
    def pages_per_seq(self) -> int:
        """Pages one max-length sequence needs."""
        return -(-self.max_seq_len // self.page_size)

    def resolve_num_pages(self, bytes_per_page: int, device_pages: int | None) -> int:
        """The pool size (page 0 is reserved); an error naming the knobs when one request cannot fit.

        device_pages: what `device_pages` found room for on an accelerator, None on CPU.
        """
        if self.num_pages is not None:
            pages = self.num_pages
        elif device_pages is not None:
            pages = device_pages
        else:
            pages = max(self.max_num_seqs // 2, 1) * self.pages_per_seq + 1
        if pages - 1 < self.pages_per_seq:
            raise ValueError(
                f"the KV pool ({pages} pages of {self.page_size} tokens) cannot hold one request of "
                f"max_seq_len {self.max_seq_len} (needs {self.pages_per_seq + 1} pages); raise num_pages "
                f"(or gpu_memory_utilization) or lower max_seq_len"
            )
        return pages

    @property
    def offload_bytes(self) -> int:
        """Bytes of host memory for offloaded prefix pages (0: offloading off)."""
        return int((self.kv_offloading_size or 0) * 2**30)

    @property
    def memory_utilization(self) -> float:
        """gpu_memory_utilization, or vLLM's default where it is None."""
        fraction = self.gpu_memory_utilization
        return DEFAULT_GPU_MEMORY_UTILIZATION if fraction is None else fraction


def check_offloading(size: object, prefix_caching: bool) -> None:
    """ValueError naming kv_offloading_size unless it is None or a number of GiB >= 0, and on only with
    prefix caching (offloaded pages are found by the prefix cache's page hashes)."""
    if size is None:
        return
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not size >= 0 or size == float("inf"):
        raise ValueError(f"kv_offloading_size must be a number of GiB >= 0 (0 or None: off), got {size!r}")
    if size and not prefix_caching:
        raise ValueError(f"kv_offloading_size={size!r} keeps evicted prefix-cache pages in host memory, and "
                         "prefix caching is off (enable_prefix_caching=False); turn it on or leave "
                         "kv_offloading_size unset")


def device_pages(stats: Mapping[str, int], utilization: float, bytes_per_page: int, activation_bytes: int) -> int:
    """KV pages that fit in `utilization` of a device's memory beside what it holds and a step's peak.

    stats: `jax.Device.memory_stats()`: bytes_limit (what JAX's allocator may hand out: on a GPU
    XLA_PYTHON_CLIENT_MEM_FRACTION of the card, 0.75 by default; a TPU's whole HBM), bytes_in_use
    (the weights, loaded first, and anything else alive). activation_bytes: the largest step
    program's temporaries and outputs. vLLM's sizing, with JAX's limit as the device's memory:
    peak_bytes_in_use is not read, since JAX cannot reset it and it may be an earlier model's.
    """
    budget = int(stats["bytes_limit"] * utilization) - stats["bytes_in_use"] - activation_bytes
    return max(budget, 0) // bytes_per_page
