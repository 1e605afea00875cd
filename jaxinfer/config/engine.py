"""Engine knobs, validated with errors that name the knob to turn (host side, no jax)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """How much the engine runs at once and how much KV memory it keeps.

    num_pages None sizes the pool from gpu_memory_utilization on accelerators, and on CPU to
    hold half of max_num_seqs sequences at max_seq_len (pages are only used as tokens arrive).
    """

    max_seq_len: int
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_prefill_seqs: int = 4
    num_pages: int | None = None
    gpu_memory_utilization: float | None = None
    page_size: int = 16
    enable_prefix_caching: bool = True
    decode_steps: int = 8

    def __post_init__(self) -> None:
        for name in ("max_seq_len", "max_num_seqs", "max_num_batched_tokens", "max_prefill_seqs", "decode_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size!r}")
        if self.num_pages is not None and (not isinstance(self.num_pages, int) or self.num_pages < 2):
            raise ValueError(f"num_pages must be an integer >= 2 (or None for automatic), got {self.num_pages!r}")
        fraction = self.gpu_memory_utilization
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {fraction!r}")

    @property
    def pages_per_seq(self) -> int:
        """Pages one max-length sequence needs."""
        return -(-self.max_seq_len // self.page_size)

    def resolve_num_pages(self, bytes_per_page: int, free_device_bytes: int | None) -> int:
        """The pool size (page 0 is reserved); an error naming the knobs when one request cannot fit."""
        if self.num_pages is not None:
            pages = self.num_pages
        elif self.gpu_memory_utilization is not None and free_device_bytes is not None:
            pages = int(free_device_bytes * self.gpu_memory_utilization) // bytes_per_page
        else:
            pages = max(self.max_num_seqs // 2, 1) * self.pages_per_seq + 1
        if pages - 1 < self.pages_per_seq:
            raise ValueError(
                f"the KV pool ({pages} pages of {self.page_size} tokens) cannot hold one request of "
                f"max_seq_len {self.max_seq_len} (needs {self.pages_per_seq + 1} pages); raise num_pages "
                f"(or gpu_memory_utilization) or lower max_seq_len"
            )
        return pages
