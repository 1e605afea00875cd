"""The engine's structured-output side: a matcher per request at add_request, each step's bitmask.

Host only, no jax. A step's mask has one row per sampled position in llguidance's packed layout
(int32 [rows, ceil(V / 32)], all ones where a row is free), filled for the constrained rows by
llguidance's thread pool with the GIL released; a step without constrained rows has no mask (the
runtime then sends its cached all-ones mask). A verify step's mask has a row per verified
position: a row's drafts are walked through its matcher and each position gets its own mask, so
a draft the constraint forbids has probability 0 and is rejected.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import numpy as np

from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.scheduler import Schedule
from jaxinfer.engine.structured.grammars import GrammarCache, llguidance_module
from jaxinfer.engine.structured.request_grammar import RequestGrammar
from jaxinfer.runtime.host_step import HostStep


class StructuredOutputs:
    """Compiles constraints (cached) and fills step masks for one model's tokenizer and vocabulary."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int] = ()):
        self.grammars = GrammarCache(tokenizer, vocab_size, eos_token_ids)
        self.vocab_size = vocab_size
        self._executor: Any = None
        self.mask_rows = 0  # masks filled so far (the overhead benchmark reads these two)
        self.mask_seconds = 0.0

    def start(self, params: SamplingParams) -> RequestGrammar | None:
        """A new sample's matcher, or None for an unconstrained request; ValueError when it does not compile."""
        constraint = params.structured_outputs
        if constraint is None:
            return None
        return RequestGrammar(self.grammars.matcher(constraint), constraint.kind)

    @property
    def executor(self) -> Any:
        if self._executor is None:  # every core: the engine's thread only waits while masks are filled
            self._executor = llguidance_module().LLExecutor(os.cpu_count() or 1)
        return self._executor

    def bitmask_for(self, schedule: Schedule, host: HostStep) -> np.ndarray | None:
        """The masks of a built step (plain or verify) for its constrained rows that sample; None when none do."""
        rows = {id(row.request): row for row in schedule.decodes + schedule.prefills}
        constrained = [
            (r, request.grammar) for r, request in enumerate(host.requests)
            if request is not None and request.grammar is not None and rows[id(request)].samples
        ]
        if host.drafts is None:
            return self.step_bitmask(constrained, len(host.requests))
        chunk = len(host.tokens) // len(host.requests)
        jobs = [(r * chunk, grammar, host.drafts[r, : host.num_drafts[r]]) for r, grammar in constrained]
        return self.verify_bitmask(jobs, len(host.tokens))

    def step_bitmask(self, rows: Sequence[tuple[int, RequestGrammar]], num_rows: int) -> np.ndarray | None:
        """Masks [num_rows, W] with row r constrained by its grammar for each (r, grammar); None when no row is."""
        if not rows:
            return None
        started = time.perf_counter()
        llg = llguidance_module()
        bitmask = llg.numpy.allocate_token_bitmask(num_rows, self.vocab_size)
        llg.numpy.fill_next_token_bitmask_par(self.executor, [(g.matcher, r) for r, g in rows], bitmask)
        self._count(len(rows), started)
        return bitmask

    def verify_bitmask(
        self, rows: Sequence[tuple[int, RequestGrammar, Sequence[int]]], num_positions: int
    ) -> np.ndarray | None:
        """Masks [num_positions, W]: for each (first position p, grammar, drafts), position p + i holds
        the mask after drafts[:i] (positions past a forbidden draft stay all ones: never sampled from)."""
        if not rows:
            return None
        started = time.perf_counter()
        llg = llguidance_module()
        bitmask = llg.numpy.allocate_token_bitmask(num_positions, self.vocab_size)
        jobs = [(g.matcher, p, [int(t) for t in drafts]) for p, g, drafts in rows]
        llg.numpy.fill_next_token_bitmask_par_with_draft_tokens(self.executor, jobs, bitmask)
        self._count(sum(1 + len(d) for _, _, d in rows), started)
        return bitmask

    def _count(self, rows: int, started: float) -> None:
        self.mask_rows += rows
        self.mask_seconds += time.perf_counter() - started
