"""Suffix decoding's structure (host side, plain Python, no jax): tries over bounded suffixes.

A `SuffixTree` counts every substring of at most `max_depth` tokens of the sequences it holds:
node = a substring, `count` = how many times it occurs, `followed` = how many of those occurrences
have a next token inside the depth bound, children = the next tokens. Appending a token to a
sequence touches the nodes of its suffixes ending there (at most max_depth); removing a sequence
walks its substrings again and frees the nodes whose count drops to zero, so memory follows what
the tree holds: at most max_depth nodes per token.

A proposal matches the context's suffixes of 1..max_depth tokens and, from each matched node,
walks the most frequent child while the product of the children's empirical probabilities
(child count / parent's `followed`) stays at or above `min_token_prob`, for at most
min(k, floor(match length x max_spec_factor)) tokens. The walk with the highest score (the
sum of those products: its expected accepted length under the counts) wins; ties keep the
longer match. This is SuffixDecoding (arXiv 2411.04975; vLLM's `method="suffix"`).

`SuffixCache` holds one tree per live request over its prompt and output, and one shared tree
over the outputs of recent requests (live ones too, so concurrent requests that fill the same
template share), bounded by `max_cached_requests` and `max_cached_tokens`: finished outputs are
evicted oldest first. A proposal takes the better of the request's own tree and the shared one.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Sequence

import numpy as np

from jaxinfer.engine.request import Request

ROOT = 0


class SuffixTree:
    """Occurrence counts of every substring (up to max_depth tokens) of the sequences it holds."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.children: list[dict[int, int] | None] = [{}]  # node -> {next token: child node}
        self.count: list[int] = [0]  # occurrences of the node's substring
        self.followed: list[int] = [0]  # ... that a next token follows within max_depth
        # The most frequent next token (ties: the lowest), -1 until a walk asks for it or after a removal.
        self.best: list[int] = [-1]
        self.free: list[int] = []  # node ids to reuse
        self.sequences: dict[Hashable, list[int]] = {}
        # Per sequence: the nodes of its suffixes of 1, 2, ... tokens ending at its last token.
        self.ends: dict[Hashable, list[int]] = {}

    @property
    def num_nodes(self) -> int:
        """Nodes in use, the root included (memory is proportional to it)."""
        return len(self.count) - len(self.free)

    @property
    def num_tokens(self) -> int:
        """Tokens of all sequences held."""
        return sum(map(len, self.sequences.values()))

    def extend(self, key: Hashable, tokens: Sequence[int]) -> None:
        """Append tokens to sequence `key` (a new sequence if unknown)."""
        sequence = self.sequences.setdefault(key, [])
        ends = self.ends.get(key, [])
        children, count, followed, best = self.children, self.count, self.followed, self.best
        for token in map(int, tokens):
            grown = []
            for parent in [ROOT, *ends[: self.max_depth - 1]]:  # one node per suffix ending here (inlined: hot)
                kids = children[parent]
                if kids is None:
                    kids = children[parent] = {}
                child = kids.get(token)
                if child is None:
                    child = kids[token] = self._new_node()
                count[child] += 1
                followed[parent] += 1
                top = best[parent]
                if top >= 0 and top != token and (count[child], -token) > (count[kids[top]], -top):
                    best[parent] = token
                grown.append(child)
            ends = grown
            sequence.append(token)
        self.ends[key] = ends

    def remove(self, key: Hashable) -> None:
        """Forget sequence `key`: every substring it contributed is counted down, empty nodes freed."""
        sequence = self.sequences.pop(key)
        self.ends.pop(key, None)
        for start in range(len(sequence)):
            path, node = [], ROOT
            for token in sequence[start : start + self.max_depth]:
                child = self.children[node][token]
                self.followed[node] -= 1
                self.count[child] -= 1
                self.best[node] = -1
                path.append((node, token, child))
                node = child
            for parent, token, child in reversed(path):
                if self.count[child] == 0:
                    del self.children[parent][token]
                    self.children[child] = None
                    self.free.append(child)

    def propose(self, context: Sequence[int], k: int, max_spec_factor: float, min_token_prob: float,
                key: Hashable | None = None) -> tuple[list[int], float]:
        """The best continuation of context (at most k tokens) and its score; ([], 0.0) when none.

        key: the sequence context is (its suffix nodes are then known without walking).
        """
        best: tuple[list[int], float] = ([], 0.0)
        ends = self.ends.get(key) if key is not None else None
        longest = len(ends) if ends is not None else self._longest_match(context)
        for length in range(longest, 0, -1):
            cap = min(k, int(length * max_spec_factor))
            if best[1] >= cap:
                break  # shorter matches are capped lower still: none can score more
            node = ends[length - 1] if ends is not None else self._find(context[len(context) - length :])
            tokens, score = self._walk(node, cap, min_token_prob)
            if score > best[1]:
                best = tokens, score
        return best

    def _find(self, pattern: Sequence[int]) -> int:
        """The node of pattern, or -1 when the tree does not hold it."""
        node = ROOT
        for token in pattern:
            node = (self.children[node] or {}).get(int(token), -1)
            if node < 0:
                return -1
        return node

    def _longest_match(self, context: Sequence[int]) -> int:
        """The length of context's longest suffix the tree holds (at most max_depth), by bisection:
        a held suffix's own suffixes are held too."""
        low, high = 0, min(len(context), self.max_depth)
        while low < high:
            mid = (low + high + 1) // 2
            if self._find(context[len(context) - mid :]) >= 0:
                low = mid
            else:
                high = mid - 1
        return low

    def _walk(self, node: int, cap: int, min_token_prob: float) -> tuple[list[int], float]:
        """Follow the most frequent child (ties: the lowest token) while the path's probability holds."""
        tokens, probability, score = [], 1.0, 0.0
        while len(tokens) < cap and self.followed[node]:
            token = self.best[node]
            if token < 0:
                token = self.best[node] = max(self.children[node].items(), key=lambda item: (self.count[item[1]], -item[0]))[0]
            child = self.children[node][token]
            probability *= self.count[child] / self.followed[node]
            if probability < min_token_prob:
                break
            tokens.append(token)
            score += probability
            node = child
        return tokens, score

    def _increment(self, parent: int, token: int) -> int:
        """Count one more occurrence of parent's substring followed by token; the child node."""
        children = self.children[parent]
        if children is None:
            children = self.children[parent] = {}
        child = children.get(token)
        if child is None:
            child = children[token] = self._new_node()
        self.count[child] += 1
        self.followed[parent] += 1
        return child

    def _new_node(self) -> int:
        if self.free:
            node = self.free.pop()
            self.count[node] = self.followed[node] = 0
            self.best[node] = -1
            return node
        self.best.append(-1)
        self.children.append(None)
        self.count.append(0)
        self.followed.append(0)
        return len(self.count) - 1


class SuffixCache:
    """Each live request's tree over its prompt and output, and a shared tree over recent outputs."""

    def __init__(self, max_depth: int, max_cached_requests: int, max_cached_tokens: int):
        self.max_cached_requests, self.max_cached_tokens = max_cached_requests, max_cached_tokens
        self.max_depth = max_depth
        self.shared = SuffixTree(max_depth)
        self.local: dict[int, SuffixTree] = {}  # by request key
        self.seen: dict[int, int] = {}  # tokens of each live request in its trees
        self.finished: collections.OrderedDict[int, int] = collections.OrderedDict()  # key -> tokens, oldest first
        self.shared_tokens = 0

    def update(self, key: int, prompt: Sequence[int], output: Sequence[int]) -> None:
        """Bring request `key`'s trees up to its prompt and output (appended to since the last call)."""
        tree = self.local.get(key)
        if tree is None:
            tree = self.local[key] = SuffixTree(self.max_depth)
            tree.extend(key, prompt)
            self.seen[key] = 0
        new = output[self.seen[key] :]
        if len(new):
            tree.extend(key, new)
            self._share(key, new)
            self.seen[key] += len(new)

    def propose(self, key: int, k: int, max_spec_factor: float, min_token_prob: float) -> np.ndarray:
        """At most k tokens continuing request `key` (call `update` first), from its own tree or the shared one."""
        tree = self.local[key]
        context = tree.sequences[key]
        tokens, score = tree.propose(context, k, max_spec_factor, min_token_prob, key=key)
        shared, shared_score = self.shared.propose(context, k, max_spec_factor, min_token_prob)
        return np.asarray(shared if shared_score > score else tokens, np.int32)

    def finish(self, key: int, output: Sequence[int]) -> None:
        """Request `key` ended with this output: its own tree goes, its output stays shared until evicted."""
        self.local.pop(key, None)
        new = output[self.seen.pop(key, 0) :]
        self._share(key, new)
        if key in self.shared.sequences:
            self.finished[key] = len(self.shared.sequences[key])
        self._evict()

    def forget_finished(self) -> None:
        """Drop every finished request's output from the shared tree (live requests keep theirs)."""
        while self.finished:
            key, tokens = self.finished.popitem(last=False)
            self.shared.remove(key)
            self.shared_tokens -= tokens

    def _share(self, key: int, tokens: Sequence[int]) -> None:
        if self.max_cached_requests and len(tokens):
            self.shared.extend(key, tokens)
            self.shared_tokens += len(tokens)
            self._evict()

    def _evict(self) -> None:
        """Finished outputs, oldest first, until the request and token bounds hold (live ones stay)."""
        while self.finished and (len(self.finished) > self.max_cached_requests
                                 or self.shared_tokens > self.max_cached_tokens):
            key, tokens = self.finished.popitem(last=False)
            self.shared.remove(key)
            self.shared_tokens -= tokens


class SuffixDrafter:
    """Suffix-decoding drafts for the engine's requests; keeps the cache in step with them."""

    def __init__(self, max_depth: int, max_cached_requests: int, max_cached_tokens: int,
                 max_spec_factor: float, min_token_prob: float):
        self.cache = SuffixCache(max_depth, max_cached_requests, max_cached_tokens)
        self.max_spec_factor, self.min_token_prob = max_spec_factor, min_token_prob
        self.live: dict[int, tuple[Request, int]] = {}  # id(request) -> (request, cache key)
        self.next_key = 0

    def track(self, requests: Sequence[Request]) -> None:
        """Note the step's requests; those seen before that have finished since hand their outputs over."""
        for request, key in [entry for entry in self.live.values() if entry[0].finished]:
            del self.live[id(request)]
            self.cache.finish(key, request.output_ids)
        for request in requests:
            if id(request) not in self.live:
                self.live[id(request)] = request, self.next_key
                self.next_key += 1

    def forget(self) -> None:
        """Drop the outputs of finished requests (a benchmark's rounds, or a changed workload)."""
        self.track([])
        self.cache.forget_finished()

    def draft(self, request: Request, k: int) -> np.ndarray:
        """At most k tokens for a tracked request."""
        key = self.live[id(request)][1]
        self.cache.update(key, request.prompt_ids, request.output_ids)
        return self.cache.propose(key, k, self.max_spec_factor, self.min_token_prob)
