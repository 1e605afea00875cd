"""The seeds of requests that give none (vLLM's engine `seed`): drawn from one stream seeded once, so a
script's sampled outputs repeat run after run; with no engine seed, fresh random ones (every process the same)."""

from __future__ import annotations

import random
from typing import Callable


class RequestSeeds:
    """Each call the next request's seed: from a stream seeded by `seed`, or `fresh()` when it is None."""

    def __init__(self, seed: int | None, fresh: Callable[[], int]):
        # Every process of a multi-host engine adds the same requests in the same order, so a seeded
        # stream agrees across them as `fresh` (process 0's draw, broadcast) does.
        self.stream = None if seed is None else random.Random(seed)
        self.fresh = fresh

    def __call__(self) -> int:
        return self.fresh() if self.stream is None else self.stream.getrandbits(63)
