"""Whole pages copied between a runner's page pool and the host: saved sessions' reads and writes, and KV
offloading's copies out and back (runtime/kv_offload's PageMover; mixed into ModelRunner: `self` is the runner)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from jaxinfer.cache import page_io
from jaxinfer.config.buckets import bucket
from jaxinfer.runtime.kv_offload import HostPage, page_bytes
from jaxinfer.runtime.ngram_rider import NgramDraft
from jaxinfer.runtime.position_pool import store_pages

if TYPE_CHECKING:
    from jaxinfer.runtime.model_runner import ModelRunner


class PageCopies:
    """The runner's page copies (its `mover`, `pages`, `draft` and `_pools_made`)."""

    def page_specs(self: ModelRunner) -> dict[str, tuple[tuple[int, ...], str]]:
        """The target pools' buffers without their page axis, and stored dtypes (see cache.page_io)."""
        return page_io.buffer_specs(self._pools_made().pages)

    def page_bytes(self: ModelRunner) -> int:
        """Host bytes of one page's copy (every layer's K/V and scales, unsharded)."""
        return page_bytes(self.page_specs())

    def read_pages(self: ModelRunner, pages: list[int]) -> dict[str, np.ndarray]:
        """Host copies of the target's K/V (and scales) in `pages` (a saved session's contents)."""
        return self.mover.read(self._pools_made().pages, pages)

    def offload_pages(self: ModelRunner, pages: list[int]) -> list[HostPage]:
        """Start copying the target's `pages` to the host (before the next call overwrites them); their copies."""
        return self.mover.offload(self._pools_made().pages, pages)

    def load_pages(self: ModelRunner, pages: list[int], copies: list[HostPage], tokens: np.ndarray) -> None:
        """Write offloaded copies back into `pages` (see write_pages), before the next call reads them."""
        values = [copy.values() for copy in copies]
        self.write_pages(pages, {name: np.stack([v[name] for v in values], axis=2) for name in values[0]}, tokens)

    def write_pages(self: ModelRunner, pages: list[int], values: dict[str, np.ndarray], tokens: np.ndarray) -> None:
        """Put K/V copied by `read_pages` into `pages`, whose tokens [len(pages), page_size] they hold; the
        device's lookup stores the tokens too. A draft model's or head's pools are left as they are: the
        engine has not marked these pages read by it, so a row using them catches its draft up."""
        self.pages = self.mover.write(self._pools_made().pages, pages, values)
        if isinstance(self.draft, NgramDraft):
            padded = np.full(bucket(len(pages)), self.num_pages, np.int32)
            padded[: len(pages)] = pages
            rows = np.zeros((len(padded), tokens.shape[1]), np.int32)
            rows[: len(pages)] = tokens
            self.draft = dataclasses.replace(self.draft, tokens=store_pages(self.draft.tokens, padded, rows))
