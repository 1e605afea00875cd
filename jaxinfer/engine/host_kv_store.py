"""The host tier of the prefix cache: evicted pages' K/V kept in host memory (plain Python, no jax).

When the block manager evicts a cached page to reuse it, its contents (every layer's K and V, and
the scales of a quantized pool) are copied here under the page's hash, so a later prompt that
starts with the same tokens copies them back instead of recomputing them (vLLM's KV offloading,
SGLang's HiCache). The store is bounded by its size: least recently stored or used pages go first.
It holds the runner's opaque page copies (runtime/kv_offload.HostPage); every page weighs the same.
"""

from __future__ import annotations

import collections
from typing import Any


class HostPageStore:
    """Page copies by page hash, least recently used first, at most capacity_bytes of them."""

    def __init__(self, capacity_bytes: int, page_bytes: int):
        self.capacity_bytes, self.page_bytes = capacity_bytes, page_bytes
        self.max_pages = capacity_bytes // page_bytes
        self.pages: collections.OrderedDict[bytes, Any] = collections.OrderedDict()
        # Counters live here, not in the block manager, which the engine replaces after a failed step.
        self.stored_pages = 0  # pages copied device -> host
        self.loaded_pages = 0  # pages copied host -> device (host-tier hits; counted by the engine as it copies)

    def __contains__(self, page_hash: bytes) -> bool:
        return page_hash in self.pages

    @property
    def used_bytes(self) -> int:
        """Bytes the stored pages hold."""
        return len(self.pages) * self.page_bytes

    def put(self, page_hash: bytes, page: Any) -> None:
        """Keep a page's copy (the least recently used ones dropped to make room)."""
        if self.max_pages == 0:
            return
        while len(self.pages) >= self.max_pages:
            self.pages.popitem(last=False)
        self.pages[page_hash] = page
        self.stored_pages += 1

    def take(self, page_hash: bytes) -> Any:
        """A stored page's copy for loading back; it stays stored, as the most recently used."""
        self.pages.move_to_end(page_hash)
        return self.pages[page_hash]

    def clear(self) -> None:
        """Forget every page (their K/V came from weights no longer served, or the prefix cache was reset)."""
        self.pages.clear()

    def metrics(self) -> dict[str, int]:
        """Pages and bytes copied each way, and what the store holds (see engine.metrics)."""
        return {
            "kv_offload_stored_pages": self.stored_pages,
            "kv_offload_stored_bytes": self.stored_pages * self.page_bytes,
            "kv_offload_loaded_pages": self.loaded_pages,
            "kv_offload_loaded_bytes": self.loaded_pages * self.page_bytes,
            "kv_offload_store_bytes": self.used_bytes,
            "kv_offload_store_capacity_bytes": self.capacity_bytes,
        }
