"""Whole pages moved between the target's page pool and the host: the device side of the prefix cache's
host tier (engine/host_kv_store) and of saved sessions.

Copy-out: the pages one schedule evicts are gathered by one program call, and their device -> host
copy starts at once (`copy_to_host_async`), so the step that overwrites them is dispatched behind the
gather without the host waiting. The host waits for the bytes only when the engine lands a call (the
device has run the gather by then: `settle`) or a page is loaded back before that. Copy-back: the
pages one schedule found in the host store are written by one scatter, with the pool's sharding.
Page counts are padded to powers of two up to a max-length sequence's pages (longer lists take
several calls): a gather and a scatter per bucket, which warm-up compiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.cache import page_io
from jaxinfer.cache.paged import POOL_AXES, SCALE_AXES, PagedKVCache
from jaxinfer.config.buckets import powers_of_two
from jaxinfer.runtime import step_programs
from jaxinfer.runtime.executables import Executables, Program

gather = step_programs.program(page_io.take)
scatter = step_programs.program(page_io.put, static=("layout",), donate=("buffers",))


class HostPage:
    """One page's K/V (and scales) on the host, per field [L, KV, page_size, ...], once its copy lands."""

    __slots__ = ("batch", "copied")

    def __init__(self, batch: "OffloadBatch"):
        self.batch: OffloadBatch | None = batch
        self.copied: dict[str, np.ndarray] | None = None

    def values(self) -> dict[str, np.ndarray]:
        """The page's arrays (waiting for its gather's copy if it has not landed yet)."""
        if self.copied is None:
            self.batch.settle()
        return self.copied


class OffloadBatch:
    """Pages gathered by one call, their copy to the host started; `settle` waits for it."""

    def __init__(self, taken: page_io.Buffers, count: int):
        for leaf in jax.tree.leaves(taken):
            leaf.copy_to_host_async()
        self.taken: page_io.Buffers | None = taken
        self.pages = [HostPage(self) for _ in range(count)]

    def settle(self) -> None:
        """Give each page its own host arrays (so a page the store drops frees its bytes) and drop the
        device buffers."""
        if self.taken is None:
            return
        stacked = page_io.stacked_on_host(self.taken, len(self.pages))
        for i, page in enumerate(self.pages):
            page.copied = {name: np.ascontiguousarray(values[:, :, i]) for name, values in stacked.items()}
            page.batch = None
        self.taken, self.pages = None, []


class PageMover:
    """Gathers and scatters of whole pages through a runner's program table, in page-count buckets."""

    def __init__(self, executables: Executables, max_pages: int):
        self.executables = executables
        self.buckets = powers_of_two(1, max_pages)
        self.unsettled: list[OffloadBatch] = []

    def offload(self, cache: PagedKVCache, pages: Sequence[int]) -> list[HostPage]:
        """Start copying `pages` to the host; their copies (in order), which fill as the copy lands."""
        copies = []
        for chunk in self._chunks(pages):
            taken = self.executables(self._gather(cache, page_io.padded_reads(chunk)))
            self.unsettled.append(OffloadBatch(taken, len(chunk)))
            copies += self.unsettled[-1].pages
        return copies

    def settle(self) -> None:
        """Land every copy started so far (after a call landed: the device has run their gathers)."""
        for batch in self.unsettled:
            batch.settle()
        self.unsettled = []

    def read(self, cache: PagedKVCache, pages: Sequence[int]) -> dict[str, np.ndarray]:
        """Host copies of `pages` now, per field [L, KV, len(pages), page_size, ...] (as page_io.read_pages)."""
        copies = [page.values() for page in self.offload(cache, pages)]
        return {name: np.stack([copy[name] for copy in copies], axis=2) for name in copies[0]} if copies else {}

    def write(self, cache: PagedKVCache, pages: Sequence[int], values: dict[str, np.ndarray]) -> PagedKVCache:
        """The cache with `pages` holding `values` ([L, KV, len(pages), page_size, ...] per field); donated."""
        top, done = self.buckets[-1], 0
        for chunk in self._chunks(pages):
            part = {name: stacked[:, :, done : done + len(chunk)] for name, stacked in values.items()}
            cache = self._write(cache, *page_io.padded_writes(cache, chunk, part))
            done += top
        return cache

    def programs(self, cache: Callable[[], PagedKVCache]) -> list[Callable[[], Program]]:
        """A gather and a scatter per page-count bucket, as thunks (what warm-up compiles)."""
        def scatter_for(count: int) -> Program:
            pool = cache()
            specs = page_io.buffer_specs(pool)
            zeros = {name: np.zeros((*shape[:2], count, *shape[2:]), jnp.dtype(dtype))
                     for name, (shape, dtype) in specs.items()}
            return self._scatter(pool, *page_io.padded_writes(pool, [0] * count, zeros))

        gathers = [lambda n=n: self._gather(cache(), np.zeros(n, np.int32)) for n in self.buckets]
        return gathers + [lambda n=n: scatter_for(n) for n in self.buckets]

    def _write(self, cache: PagedKVCache, targets: np.ndarray, values: dict[str, np.ndarray]) -> PagedKVCache:
        written = self.executables(self._scatter(cache, targets, values))
        return dataclasses.replace(cache, **written)

    def _chunks(self, pages: Sequence[int]) -> list[list[int]]:
        top = self.buckets[-1]
        return [list(pages[i : i + top]) for i in range(0, len(pages), top)]

    @staticmethod
    def _gather(cache: PagedKVCache, pages: np.ndarray) -> Program:
        return Program(gather, [page_io.page_buffers(cache), pages], {}, fixed=1)

    @staticmethod
    def _scatter(cache: PagedKVCache, targets: np.ndarray, values: dict[str, np.ndarray]) -> Program:
        # Put with the pool's sharding (kv heads over tp): each device gets its share, not the whole page.
        layout = cache.layout
        placed = {name: layout.put(stacked, (None, *(POOL_AXES if stacked.ndim == 5 else SCALE_AXES)))
                  for name, stacked in values.items()}
        return Program(scatter, [page_io.page_buffers(cache), targets, placed], dict(layout=layout), fixed=1)


def page_bytes(specs: dict[str, tuple[tuple[int, ...], str]]) -> int:
    """Host bytes of one page's copy given the pool's `page_io.buffer_specs`."""
    return sum(int(np.prod(shape)) * jnp.dtype(dtype).itemsize for shape, dtype in specs.values())
