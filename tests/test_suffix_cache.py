"""Suffix decoding's trees against a brute-force reference (occurrences found by scanning the
sequences), bounded memory and eviction; no model."""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer.engine.suffix_cache import SuffixCache, SuffixTree


def reference(sequences: list[list[int]], context: list[int], k: int, depth: int, factor: float,
              min_prob: float) -> tuple[list[int], float]:
    """The proposal by scanning: occurrences of each context suffix, then the most frequent next token."""
    best: tuple[list[int], float] = ([], 0.0)
    for length in range(min(len(context), depth), 0, -1):
        pattern = context[len(context) - length :]
        hits = [(s, start) for s, seq in enumerate(sequences) for start in range(len(seq) - length + 1)
                if seq[start : start + length] == pattern]
        if not hits:
            continue
        tokens, probability, score = [], 1.0, 0.0
        while len(tokens) < min(k, int(length * factor)):
            reach = length + len(tokens)  # the substring matched so far, from each hit's start
            nexts = [sequences[s][start + reach] for s, start in hits
                     if reach < depth and start + reach < len(sequences[s])]
            if not nexts:
                break
            counts = np.bincount(nexts)
            token = int(np.argmax(counts))  # the first maximum: ties keep the lowest token
            probability *= counts[token] / len(nexts)
            if probability < min_prob:
                break
            tokens.append(token)
            score += probability
            hits = [(s, start) for s, start in hits
                    if reach < depth and start + reach < len(sequences[s]) and sequences[s][start + reach] == token]
        if score > best[1]:
            best = tokens, score
    return best


def random_sequence(rng: np.random.RandomState, length: int, vocab: int) -> list[int]:
    """Random tokens with copied runs, so long suffixes match and walks branch."""
    out = list(rng.randint(0, vocab, size=3))
    while len(out) < length:
        if rng.rand() < 0.5:
            start = rng.randint(0, len(out))
            out += out[start : start + rng.randint(1, 8)]
        else:
            out.append(int(rng.randint(0, vocab)))
    return out[:length]


@pytest.mark.parametrize("seed", range(6))
def test_proposals_match_brute_force(seed):
    rng = np.random.RandomState(seed)
    depth, factor, min_prob = [(4, 1.0, 0.1), (8, 0.5, 0.3), (24, 2.0, 0.0), (3, 4.0, 0.5), (6, 1.5, 0.2),
                               (10, 1.0, 0.05)][seed]
    vocab = [3, 5, 8, 4, 6, 12][seed]
    tree = SuffixTree(depth)
    sequences = {}
    for step in range(60):
        key = int(rng.randint(0, 4))
        new = random_sequence(rng, int(rng.randint(1, 6)), vocab)
        tree.extend(key, new)
        sequences.setdefault(key, []).extend(new)
        if step % 17 == 16:  # a removed sequence leaves exactly what the others hold
            gone = int(rng.choice(list(sequences)))
            tree.remove(gone)
            del sequences[gone]
        for key, context in sequences.items():
            k = int(rng.randint(1, 9))
            expected = reference(list(sequences.values()), context, k, depth, factor, min_prob)
            for got in (tree.propose(context, k, factor, min_prob),  # by walking from the root
                        tree.propose(context, k, factor, min_prob, key=key)):  # from the sequence's own ends
                assert got[0] == expected[0] and got[1] == pytest.approx(expected[1])
        context = random_sequence(rng, 12, vocab)  # a context the tree does not hold
        expected = reference(list(sequences.values()), context, 6, depth, factor, min_prob)
        got = tree.propose(context, 6, factor, min_prob)
        assert got[0] == expected[0] and got[1] == pytest.approx(expected[1])


def test_walk_prefers_the_frequent_continuation_and_stops_at_the_threshold():
    tree = SuffixTree(8)
    tree.extend("a", [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 4])
    # [1, 2] is followed by 3 three times and by 5 once: 3 (0.75), then always 4, 1, 2 (still 0.75).
    assert tree.propose([9, 1, 2], 4, 2.0, 0.1) == ([3, 4, 1, 2], pytest.approx(4 * 0.75))
    assert tree.propose([9, 1, 2], 4, 2.0, 0.8)[0] == []  # 0.75 < 0.8 at the first token
    assert tree.propose([9, 1, 2], 4, 1.0, 0.1)[0] == [3, 4]  # capped at the match length (2) x 1.0


def test_removing_everything_frees_every_node():
    rng = np.random.RandomState(0)
    tree = SuffixTree(6)
    for key in range(5):
        tree.extend(key, random_sequence(rng, 200, 7))
    peak = tree.num_nodes
    assert 1 < peak <= 1 + 5 * 200 * 6  # at most max_depth nodes per token
    for key in range(5):
        tree.remove(key)
    assert tree.num_nodes == 1 and tree.children[0] == {} and tree.followed[0] == 0
    allocated = len(tree.count)
    tree.extend(9, random_sequence(rng, 100, 7))
    assert len(tree.count) == allocated and 1 < tree.num_nodes < peak  # freed ids were reused


def test_shared_outputs_are_bounded_and_evicted_oldest_first():
    cache = SuffixCache(max_depth=8, max_cached_requests=3, max_cached_tokens=50)
    outputs = {key: [100 + key] * 4 + [key] * 6 for key in range(5)}
    for key, output in outputs.items():
        cache.update(key, [7, 8, 9], output[:4])
        cache.finish(key, output)
        assert len(cache.finished) <= 3 and cache.shared_tokens <= 50 and not cache.local
    assert list(cache.finished) == [2, 3, 4]  # 0 and 1 went first
    assert set(cache.shared.sequences) == {2, 3, 4}
    cache = SuffixCache(max_depth=8, max_cached_requests=10, max_cached_tokens=25)
    for key, output in outputs.items():
        cache.finish(key, output)
    assert list(cache.finished) == [3, 4] and cache.shared_tokens == 20
    cache.forget_finished()
    assert cache.shared.num_nodes == 1 and cache.shared_tokens == 0 and not cache.finished
    cache = SuffixCache(max_depth=8, max_cached_requests=0, max_cached_tokens=100)  # no shared outputs
    cache.finish(0, outputs[0])
    assert cache.shared.num_nodes == 1 and not cache.finished


def test_a_later_request_continues_an_earlier_output():
    """The second request's own tokens never saw the template; the shared tree did."""
    cache = SuffixCache(max_depth=16, max_cached_requests=10, max_cached_tokens=1000)
    template = [50, 51, 52, 53, 54, 55, 56, 57, 58, 59]
    cache.update(0, [1, 2, 3], template)
    cache.finish(0, template)
    cache.update(1, [4, 5, 6], template[:3])
    assert cache.propose(1, 8, 2.0, 0.1).tolist() == template[3:9]
    cache.update(1, [4, 5, 6], template[:3] + [99])
    assert cache.propose(1, 8, 2.0, 0.1).tolist() == []
