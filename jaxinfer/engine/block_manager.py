"""KV pages: allocation, reference counts, and the prefix cache (plain Python, no jax).

A full page of token ids is named by a hash chained over every page before it, seeded with
the model's identity, so a hit means "the same tokens after the same prefix on the same
weights". Pages with no references stay cached until the pool needs them; they are evicted
least recently freed first, and a finished sequence frees its tail pages first, so the
prefix pages shared by most requests are the last to go.

A sequence's pages are handed out in ascending order, continuing its last page when the next
one is free: the CPU attention kernel reads a sequence's pages in order, and reads adjacent
ascending pages 2-3x faster than scattered or descending ones (the hardware prefetchers follow
them). With `spread` (the engine's choice on CPU), a sequence that cannot continue starts in
the middle of the largest run of free pages, leaving the sequence before the run half of it
to grow into, so sequences growing side by side keep their pages adjacent: 5-7% more serving
throughput on this project's 2-core CPU (demo and SmolLM-135M shapes). Which pages a sequence
holds never changes a result.

With a host tier (`host`: engine/host_kv_store), an evicted cached page is queued in `offloads` to
be copied there, and a prefix lookup that stops matching in the pool goes on in the host store:
each page found there gets a fresh pool page, published at once under its hash and queued in
`uploads`. The engine hands both queues to the runner before the next device call (`take_moves`),
copies out first, so a page evicted and reused in one schedule is saved before it is overwritten.
"""

from __future__ import annotations

import collections
import hashlib

import numpy as np

from jaxinfer.engine.host_kv_store import HostPageStore


def page_hash(parent: bytes, token_ids: list[int]) -> bytes:
    """Identity of one full page given the hash of everything before it."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(b",".join(str(t).encode() for t in token_ids))
    return digest.digest()


class OutOfPages(RuntimeError):
    """The pool has no free or evictable page left."""


class BlockManager:
    """The page pool of the paged KV cache. Page 0 is reserved as padding for unused table slots."""

    def __init__(
        self, num_pages: int, page_size: int, model_identity: str, prefix_caching: bool = True, spread: bool = False,
        host: HostPageStore | None = None,
    ):
        """host: the prefix cache's host tier (None: evicted pages are forgotten)."""
        self.num_pages = num_pages
        self.page_size = page_size
        self.prefix_caching = prefix_caching
        self.spread = spread
        self.root = hashlib.blake2b(model_identity.encode(), digest_size=16).digest()
        self.refs = [0] * num_pages
        # Ordered sets, oldest first (OrderedDict: taking the oldest is O(1), a dict's is not).
        self.free: collections.OrderedDict[int, None] = collections.OrderedDict.fromkeys(range(1, num_pages))
        self.evictable: collections.OrderedDict[int, None] = collections.OrderedDict()  # LRU
        self.by_hash: dict[bytes, int] = {}
        self.hash_of: dict[int, bytes] = {}
        # Pages whose every position a draft model or EAGLE head has read (its K/V and outputs there
        # written): a prefix hit on them spares the draft's catch-up. Cleared when a page is handed out.
        self.draft_read: set[int] = set()
        self.host = host
        self.offloads: list[tuple[int, bytes]] = []  # evicted (page, hash) to copy to the host store
        self.uploads: dict[int, tuple[object, list[int]]] = {}  # page -> (host copy, its tokens) to copy back

    @property
    def usable_pages(self) -> int:
        """Pages a request could still get: free plus evictable."""
        return len(self.free) + len(self.evictable)

    @property
    def usage(self) -> float:
        """Fraction of the pool referenced by running sequences."""
        return 1.0 - self.usable_pages / (self.num_pages - 1)

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold num_tokens."""
        return -(-num_tokens // self.page_size)

    def root_for(self, adapter: str | None) -> bytes:
        """What a sequence's page hashes chain from: the model's identity, and its LoRA adapter's
        name when it runs with one (the same tokens give other K/V under another adapter)."""
        if adapter is None:
            return self.root
        return hashlib.blake2b(self.root + b"lora:" + adapter.encode(), digest_size=16).digest()

    def chain(self, token_ids: list[int], num_pages: int, adapter: str | None = None) -> list[bytes]:
        """Hashes of the first num_pages full pages of token_ids."""
        hashes, parent = [], self.root_for(adapter)
        for i in range(num_pages):
            parent = page_hash(parent, token_ids[i * self.page_size : (i + 1) * self.page_size])
            hashes.append(parent)
        return hashes

    def match_prefix(self, token_ids: list[int], adapter: str | None = None) -> tuple[list[int], list[bytes]]:
        """Cached pages (and their hashes) holding the longest full-page prefix of token_ids.

        The pages are referenced for the caller. The last token is never served from the
        cache: its logits are needed. With a host tier, pages found there continue the match.
        """
        covered = token_ids[: (len(token_ids) - 1) // self.page_size * self.page_size]
        pages, hashes = self.match_pages(covered, adapter)
        if self.host is None or len(pages) * self.page_size == len(covered):
            return pages, hashes
        return self._match_host(covered, pages, hashes, adapter)

    def _match_host(
        self, token_ids: list[int], pages: list[int], hashes: list[bytes], adapter: str | None
    ) -> tuple[list[int], list[bytes]]:
        """pages and hashes continued by the pages of token_ids the host store holds, each given a fresh
        pool page (while one is free or evictable) that is published and queued for its copy back."""
        chained = self.chain(token_ids, len(token_ids) // self.page_size, adapter)
        for i in range(len(pages), len(chained)):
            if chained[i] not in self.host or not self.usable_pages:
                break
            page = self.allocate(1, after=pages[-1] if pages else None)[0]
            self.by_hash[chained[i]], self.hash_of[page] = page, chained[i]
            self.uploads[page] = (self.host.take(chained[i]), token_ids[i * self.page_size : (i + 1) * self.page_size])
            pages.append(page)
        return pages, chained[: len(pages)]

    def take_moves(self) -> tuple[list[tuple[int, bytes]], dict[int, tuple[object, list[int]]]]:
        """The queued copies (offloads, uploads), emptied: the runner makes them before the next call."""
        moves = self.offloads, self.uploads
        self.offloads, self.uploads = [], {}
        return moves

    def match_pages(self, token_ids: list[int], adapter: str | None = None) -> tuple[list[int], list[bytes]]:
        """Cached pages (and their hashes) holding the longest prefix of token_ids' full pages,
        referenced for the caller."""
        if not self.prefix_caching:
            return [], []
        pages, hashes = [], self.chain(token_ids, len(token_ids) // self.page_size, adapter)
        for h in hashes:
            page = self.by_hash.get(h)
            if page is None:
                break
            pages.append(page)
        for page in pages:
            self._ref(page)
        return pages, hashes[: len(pages)]

    def allocate(self, count: int, after: int | None = None) -> list[int]:
        """count fresh pages (evicting cached ones if needed); raises OutOfPages, taking none.

        The free pages right after `after` (the sequence's last page) come first, then (with
        `spread`) a run in the largest free gap, else the oldest free pages in ascending order.
        """
        if count > self.usable_pages:
            raise OutOfPages(f"need {count} pages, {self.usable_pages} left")
        following = []
        while after is not None and len(following) < count and after + 1 in self.free:
            after += 1
            del self.free[after]
            following.append(after)
        need = count - len(following)
        rest = self._take_run(need) if need and self.spread else []
        for _ in range(need - len(rest)):
            if not self.free:
                self._evict_one()
            rest.append(self.free.popitem(last=False)[0])
        pages = following + sorted(rest)
        for page in pages:
            self.refs[page] = 1
        self.draft_read.difference_update(pages)
        return pages

    def _take_run(self, count: int) -> list[int]:
        """count adjacent free pages from the largest free gap (none when no gap holds them): from
        its middle, so the sequence ending before the gap keeps half of it, or from its start when
        the gap starts the pool."""
        start, length = largest_run(np.fromiter(self.free, np.int64, len(self.free)))
        if length < count:
            return []
        first = start + min(length // 2 if start > 1 else 0, length - count)
        for page in range(first, first + count):
            del self.free[page]
        return list(range(first, first + count))

    def release(self, pages: list[int]) -> None:
        """Drop one reference to each page, tail first; unreferenced cached pages become evictable."""
        for page in reversed(pages):
            self.refs[page] -= 1
            if self.refs[page] > 0:
                continue
            if page in self.hash_of:
                self.evictable[page] = None
            else:
                self.free[page] = None

    def register(
        self, token_ids: list[int], pages: list[int], hashes: list[bytes], end: int, adapter: str | None = None,
    ) -> None:
        """Publish full pages len(hashes)..end-1 of a sequence (K/V computed; under `adapter`, see
        root_for); extends `hashes` in place."""
        if not self.prefix_caching:
            return
        parent = hashes[-1] if hashes else self.root_for(adapter)
        for i in range(len(hashes), end):
            parent = page_hash(parent, token_ids[i * self.page_size : (i + 1) * self.page_size])
            hashes.append(parent)
            if parent not in self.by_hash and pages[i] not in self.hash_of:
                self.by_hash[parent] = pages[i]
                self.hash_of[pages[i]] = parent

    def mark_draft_read(self, pages: list[int], before: int, after: int) -> None:
        """A draft that had read positions 0 .. before-1 of the sequence holding pages now has read
        0 .. after-1: flag the pages that became full of read positions (each step touches only those)."""
        self.draft_read.update(pages[before // self.page_size : after // self.page_size])

    def draft_read_prefix(self, pages: list[int]) -> int:
        """How many leading pages of pages a draft has read (see mark_draft_read)."""
        count = 0
        while count < len(pages) and pages[count] in self.draft_read:
            count += 1
        return count

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix: unreferenced cached pages become free, no page is findable."""
        self.free.update(self.evictable)
        self.evictable.clear()
        self.by_hash.clear()
        self.hash_of.clear()
        self.offloads, self.uploads = [], {}
        if self.host is not None:
            self.host.clear()

    def _ref(self, page: int) -> None:
        if self.refs[page] == 0:
            self.evictable.pop(page, None)
        self.refs[page] += 1

    def _evict_one(self) -> None:
        page, _ = self.evictable.popitem(last=False)
        page_hash = self.hash_of.pop(page)
        del self.by_hash[page_hash]
        self.free[page] = None
        # A page still waiting for its copy back was never written: the host store has (or dropped) it.
        if self.host is not None and self.uploads.pop(page, None) is None and page_hash not in self.host:
            self.offloads.append((page, page_hash))


def largest_run(pages: np.ndarray) -> tuple[int, int]:
    """(first page, length) of the longest run of consecutive numbers in pages (the lowest such
    run on a tie); (0, 0) when there are none."""
    if not len(pages):
        return 0, 0
    ordered = np.sort(pages)
    breaks = np.flatnonzero(np.diff(ordered) != 1) + 1
    starts = np.concatenate([[0], breaks])
    lengths = np.diff(np.concatenate([starts, [len(ordered)]]))
    best = int(np.argmax(lengths))
    return int(ordered[starts[best]]), int(lengths[best])
