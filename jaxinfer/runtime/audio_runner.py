"""Whisper's encoder beside the engine's steps: when a request's first chunk is scheduled (a new request, or a
preempted one recomputing from position 0), one program runs its encoder over its log-mel features and writes
each decoder layer's cross-attention keys and values into its row slot (cache/cross_pool), before the step that
reads them. The features stay with the request (`Request.audio`); the encoder's output is not kept (a
recomputing request runs the encoder again: one call, ~a prefill chunk's cost, for no held memory).
"""

from __future__ import annotations

import numpy as np

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.models.whisper_encoder import AudioEncoder
from jaxinfer.parallel.sharding import Layout
from jaxinfer.runtime import step_programs
from jaxinfer.runtime.executables import Executables, Program
from jaxinfer.runtime.host_step import HostStep


class AudioRunner:
    """An encoder-decoder model's encoder on the device, its one program run through the engine's table."""

    def __init__(self, encoder: AudioEncoder, feature_shape: tuple[int, int], layout: Layout,
                 executables: Executables):
        """feature_shape: (mel bins, feature frames) every request's features have (the extractor pads them)."""
        self.encoder, self.feature_shape, self.layout, self.executables = encoder, feature_shape, layout, executables
        self.encoded = 0  # encoder calls (the tests count them)

    def program(self, pages: PagedKVCache, features: np.ndarray | None = None, slot: int = 0) -> Program:
        """The encoder's program writing row slot `slot` (zeros: what warm-up compiles)."""
        features = np.zeros(self.feature_shape, np.float32) if features is None else features
        return Program(step_programs.encode_audio, [self.encoder, pages, self.layout.put(features),
                                                    self.layout.put(np.int32(slot))], {}, fixed=2)

    def fill(self, pages: PagedKVCache, host: HostStep, slots: np.ndarray) -> PagedKVCache:
        """pages with the cross-attention rows of each of the step's rows that starts its request at position 0."""
        for row, request in enumerate(host.requests):
            if request is None or request.audio is None or host.query_lens[row] <= 0:
                continue
            first = host.last_index[row] - host.query_lens[row] + 1
            if host.positions[first] == 0 and (host.carried is None or not host.carried[row]):
                pages = self.executables(self.program(pages, request.audio, int(slots[row])))
                self.encoded += 1
        return pages
