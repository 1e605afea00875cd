"""The engine's structured-output side: a matcher per request at add_request, each step's bitmask.

Host only, no jax. A step's mask has one row per sampled position in llguidance's packed layout
(int32 [rows, ceil(V / 32)], all ones where a row is free), filled for the constrained rows by
llguidance's thread pool with the GIL released and narrowed by their token filters
(`token_filter`: allowed_token_ids, bad_words); a step without constrained rows has no mask (the
runtime then sends its cached all-ones mask). A verify step's mask has a row per verified
position: a row's drafts are walked through its matcher and each position gets its own mask, so
a draft the constraint forbids has probability 0 and is rejected.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import numpy as np

from jaxinfer.config import validation
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.scheduler import Schedule
from jaxinfer.engine.structured.grammars import GrammarCache, llguidance_module
from jaxinfer.engine.structured.request_grammar import RequestGrammar
from jaxinfer.engine.structured.token_filter import TokenFilter, bad_word_ids, packed_words
from jaxinfer.runtime.host_step import HostStep


class StructuredOutputs:
    """Compiles constraints (cached) and fills step masks for one model's tokenizer and vocabulary."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int] = ()):
        self.grammars = GrammarCache(tokenizer, vocab_size, eos_token_ids)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._executor: Any = None
        self.mask_rows = 0  # masks filled so far (the overhead benchmark reads these two)
        self.mask_seconds = 0.0

    def start(self, params: SamplingParams) -> RequestGrammar | None:
        """A new sample's matcher and token filter, or None for an unconstrained request; ValueError when a
        constraint does not compile or a filter does not fit the model."""
        constraint = params.structured_outputs
        if constraint is None and not params.filters_tokens:
            return None
        matcher = None if constraint is None else self.grammars.matcher(constraint)
        kind = "allowed_token_ids/bad_words" if constraint is None else constraint.kind
        return RequestGrammar(matcher, kind, self._token_filter(params) if params.filters_tokens else None)

    def _token_filter(self, params: SamplingParams) -> TokenFilter:
        if params.allowed_token_ids is not None:
            validation.token_ids(params.allowed_token_ids, "allowed_token_ids", self.vocab_size)
        if params.bad_words and self.tokenizer is None:
            raise ValueError("bad_words needs the model's tokenizer to find the words' tokens; this model directory "
                             "has none (ban token ids with logit_bias instead)")
        words = bad_word_ids(self.tokenizer, params.bad_words) if params.bad_words else []
        return TokenFilter(self.vocab_size, params.allowed_token_ids, words)

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
        bitmask = np.full((num_rows, packed_words(self.vocab_size)), -1, np.int32)
        matched = [(g.matcher, r) for r, g in rows if g.matcher is not None]
        if matched:
            llguidance_module().numpy.fill_next_token_bitmask_par(self.executor, matched, bitmask)
        for r, grammar in rows:
            if grammar.token_filter is not None:
                bitmask[r] &= grammar.token_filter.row()
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
        bitmask = np.full((num_positions, packed_words(self.vocab_size)), -1, np.int32)
        jobs = [(g.matcher, p, [int(t) for t in drafts]) for p, g, drafts in rows if g.matcher is not None]
        if jobs:
            llguidance_module().numpy.fill_next_token_bitmask_par_with_draft_tokens(self.executor, jobs, bitmask)
        for p, grammar, drafts in rows:
            if grammar.token_filter is not None:
                for i in range(len(drafts) + 1):
                    bitmask[p + i] &= grammar.token_filter.row(drafts[:i])
        self._count(sum(1 + len(d) for _, _, d in rows), started)
        return bitmask

    def _count(self, rows: int, started: float) -> None:
        self.mask_rows += rows
        self.mask_seconds += time.perf_counter() - started
