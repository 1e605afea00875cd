"""The host-side page pool: chained prefix hashes, reference counts, LRU eviction, usage, placement."""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer.engine.block_manager import BlockManager, OutOfPages, largest_run

PAGE = 4


def cached_sequence(blocks: BlockManager, token_ids: list[int]) -> list[int]:
    """Allocate pages for token_ids, publish its full pages (as after prefill) and return them."""
    pages = blocks.allocate(blocks.pages_for(len(token_ids)))
    blocks.register(token_ids, pages, [], len(token_ids) // blocks.page_size)
    return pages


def test_hash_is_chained_over_full_pages() -> None:
    """A page's hash names its tokens and every page before it, not its tokens alone."""
    blocks = BlockManager(8, PAGE, "model-a")
    base = list(range(12))
    hashes = blocks.chain(base, 3)
    assert len(set(hashes)) == 3
    assert blocks.chain(base, 3) == hashes
    changed_first = [99] + base[1:]
    assert all(a != b for a, b in zip(blocks.chain(changed_first, 3), hashes))  # every later page too
    changed_second = base[:PAGE] + [99] + base[PAGE + 1 :]
    assert blocks.chain(changed_second, 3)[0] == hashes[0]
    assert all(a != b for a, b in zip(blocks.chain(changed_second, 3)[1:], hashes[1:]))
    same_tokens_moved = base[PAGE : 2 * PAGE] + base[:PAGE]  # page 0's tokens, now second
    assert blocks.chain(same_tokens_moved, 2)[1] != hashes[0]


def test_model_identity_seeds_the_hashes() -> None:
    """Two model identities never name a page alike; the same identity always does."""
    token_ids = list(range(16))
    a, a_again, b = (BlockManager(8, PAGE, name) for name in ("model-a", "model-a", "model-b"))
    assert a.chain(token_ids, 4) == a_again.chain(token_ids, 4)
    assert not set(a.chain(token_ids, 4)) & set(b.chain(token_ids, 4))


def test_same_prefix_shares_pages_up_to_the_first_difference() -> None:
    """A second request finds the first one's full pages, up to where the tokens differ."""
    blocks = BlockManager(16, PAGE, "model-a")
    first = list(range(13))  # 3 full pages + 1 token
    pages = cached_sequence(blocks, first)
    shared, hashes = blocks.match_prefix(first[:8] + [77] + first[9:])
    assert shared == pages[:2]
    assert hashes == blocks.chain(first, 2)
    whole, _ = blocks.match_prefix(first)
    assert whole == pages[:3]
    only_full, _ = blocks.match_prefix(first[:12])
    assert only_full == pages[:2]  # the last token is never served from the cache: its logits are needed


def test_prefix_caching_off_finds_nothing() -> None:
    """With prefix caching off no page is published or found."""
    blocks = BlockManager(16, PAGE, "model-a", prefix_caching=False)
    token_ids = list(range(13))
    cached_sequence(blocks, token_ids)
    assert blocks.match_prefix(token_ids) == ([], [])


def test_shared_page_is_freed_only_by_its_last_user() -> None:
    """A page two sequences hold stays referenced until both release it."""
    blocks = BlockManager(9, PAGE, "model-a")  # 8 usable pages
    token_ids = list(range(9))
    owner = cached_sequence(blocks, token_ids)  # 3 pages, 2 of them full
    sharer, _ = blocks.match_prefix(token_ids)
    sharer += blocks.allocate(1)
    assert blocks.usable_pages == 8 - 4
    blocks.release(owner)
    assert blocks.usable_pages == 8 - 3  # owner's tail page free; the 2 shared ones still held
    assert blocks.usage == pytest.approx(3 / 8)
    blocks.release(sharer)
    assert blocks.usable_pages == 8
    assert blocks.usage == 0.0
    again, _ = blocks.match_prefix(token_ids)  # released cached pages are still findable
    assert again == owner[:2]


def test_lru_eviction_takes_tail_pages_first() -> None:
    """With no free page left, the least recently freed cached page goes: a sequence's tail first."""
    blocks = BlockManager(5, PAGE, "model-a")  # 4 usable pages
    token_ids = list(range(17))  # 4 full pages + 1 token: the whole pool is cached
    pages = cached_sequence(blocks, token_ids[:16])
    blocks.release(pages)
    assert blocks.usage == 0.0 and blocks.usable_pages == 4
    fresh = blocks.allocate(1)
    assert fresh == [pages[3]]  # the tail page was freed first, so it is evicted first
    found, _ = blocks.match_prefix(token_ids)
    assert found == pages[:3]
    blocks.release(found)
    blocks.release(fresh)  # uncached: goes straight to the free list, evicts nothing
    assert blocks.match_prefix(token_ids)[0] == pages[:3]


def test_recently_reused_pages_outlive_older_ones() -> None:
    """A cached page that was used again more recently is evicted after one that was not."""
    blocks = BlockManager(5, PAGE, "model-a")  # 4 usable pages
    old, recent = list(range(0, 4)), list(range(100, 104))
    old_pages = cached_sequence(blocks, old)
    recent_pages = cached_sequence(blocks, recent)
    blocks.release(recent_pages)  # freed first: would be evicted first without the reuse below
    blocks.release(old_pages)
    reused, _ = blocks.match_prefix(recent + [1])
    blocks.release(reused)  # freed again now: most recent in the LRU order
    blocks.allocate(2)  # the 2 free pages
    assert blocks.allocate(1) == old_pages
    assert blocks.match_prefix(old + [1])[0] == []
    assert blocks.match_prefix(recent + [1])[0] == recent_pages


def test_allocate_beyond_the_pool_takes_nothing() -> None:
    """Asking for more pages than are free or evictable raises and leaves the pool as it was."""
    blocks = BlockManager(5, PAGE, "model-a")
    held = blocks.allocate(3)
    assert 0 not in held  # page 0 is padding for unused table slots
    with pytest.raises(OutOfPages, match="need 2 pages, 1 left"):
        blocks.allocate(2)
    assert blocks.usable_pages == 1
    assert blocks.usage == pytest.approx(3 / 4)


def test_reset_prefix_cache_frees_cached_pages() -> None:
    """After a reset, no prefix is found and unreferenced cached pages are plain free pages."""
    blocks = BlockManager(9, PAGE, "model-a")
    token_ids = list(range(9))
    pages = cached_sequence(blocks, token_ids)
    blocks.release(pages)
    blocks.reset_prefix_cache()
    assert blocks.match_prefix(token_ids)[0] == []
    assert blocks.usable_pages == 8 and blocks.usage == 0.0


def test_pages_come_in_ascending_order() -> None:
    """Pages freed tail first (so evicted in descending order) are handed out ascending."""
    blocks = BlockManager(9, PAGE, "model-a")  # 8 usable pages
    pages = cached_sequence(blocks, list(range(32)))  # the whole pool, cached
    blocks.release(pages)  # evictable tail first: 8, 7, ..., 1
    assert blocks.allocate(3) == [6, 7, 8]
    assert blocks.allocate(2) == [4, 5]


def test_a_sequence_continues_into_the_next_free_page() -> None:
    """With `after`, the free pages right after a sequence's last page come first, then the rest."""
    blocks = BlockManager(12, PAGE, "model-a")  # pages 1..11 free
    first = blocks.allocate(2)  # [1, 2]
    other = blocks.allocate(2)  # [3, 4]
    blocks.release(first)  # 1, 2 free again, at the end of the free order
    assert blocks.allocate(2, after=other[-1]) == [5, 6]  # continues 3, 4
    assert blocks.allocate(3, after=2) == [7, 8, 9]  # page 3 is held: the oldest free pages instead
    assert blocks.allocate(1, after=9) == [10]
    assert blocks.allocate(3) == [1, 2, 11]  # the free order was 11, 2, 1


def test_spread_starts_a_new_sequence_mid_gap_so_neighbours_keep_growing() -> None:
    """With spread, a sequence that cannot continue starts in the middle of the largest free gap
    (at the pool's start for the first), so three sequences growing in turn stay contiguous."""
    blocks = BlockManager(65, PAGE, "model-a", spread=True)  # pages 1..64 free
    seqs = [blocks.allocate(2) for _ in range(3)]
    assert seqs == [[1, 2], [34, 35], [18, 19]]
    for _ in range(4):
        for seq in seqs:
            seq += blocks.allocate(1, after=seq[-1])
    assert all(seq == list(range(seq[0], seq[0] + 6)) for seq in seqs)


def test_spread_takes_scattered_pages_when_no_gap_holds_the_request() -> None:
    blocks = BlockManager(9, PAGE, "model-a", spread=True)  # pages 1..8
    held = blocks.allocate(8)
    blocks.release([held[1], held[3], held[5]])  # free, oldest first: 6, 4, 2 (gaps of one page)
    assert blocks.allocate(2) == [4, 6]  # no gap of two: the oldest free pages, ascending
    assert blocks.allocate(1) == [2]
    assert largest_run(np.array([7, 3, 4, 5, 9, 10])) == (3, 3) and largest_run(np.array([], np.int64)) == (0, 0)
