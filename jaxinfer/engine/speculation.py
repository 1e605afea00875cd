"""Speculative decoding inside the engine: drafts planned on the host, verified on device.

The engine knows every request's tokens on the host, so the n-gram proposer is a NumPy search
there (no token buffer on the device), and suffix decoding's tries live there (`suffix_cache`).
A draft model (`runtime/draft_model_rider`) or an EAGLE head (`runtime/eagle_rider`) drafts on the device inside the
verify step; the host plans only how many tokens each row drafts. Each row drafts its own
length: a moving average of its acceptance and a cost model, so speculation switches itself off as the batch grows or where a
verify step costs more than its accepted tokens save. The cost model is what the engine measured
of its own steps at this batch size (`step_costs`; unless `calibrate=False`), the heuristic of
`speculative.round_plan` until then. After REPROBE_STEPS plain steps in a row at one batch size (more
where a measuring call is dear: PROBE_SHARE), one verify step drafts what it can: it measures the
rows' acceptance and the verify cost again, so a request whose text starts repeating (or a
machine that got less busy) switches speculation back on.
A call that measures (a row's first verify step, or the reprobe) runs one round, however many a
draft model or head could run: `measuring`.
Penalties, which the verify step does not implement (a penalized row's counts change at every
position it verifies), make the step run plainly; logprobs come from every verified position.
Structured-output rows verify host (n-gram) drafts under a mask per position; a draft model or
head does not draft for them (the host cannot mask drafts it has not seen).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from jaxinfer.config.model import ModelConfig
from jaxinfer.engine.ngram_lookup import common_prefix, ngram_draft
from jaxinfer.engine.request import Request
from jaxinfer.engine.spec_counters import moving_average, speculation_metrics, step_counters, zero_counts
from jaxinfer.engine.step_costs import StepCosts
from jaxinfer.engine.suffix_cache import SuffixDrafter
from jaxinfer.runtime.host_step import CATCH_UP_SPAN
from jaxinfer.speculative.acceptance_summary import SpecMetrics
from jaxinfer.speculative.config import SpeculativeConfig
from jaxinfer.speculative.round_plan import CostModel, heuristic_costs, on_host, round_cost, round_plan

if TYPE_CHECKING:  # the drafts' weights and shapes are the runner's; the plan reads only their cost
    from jaxinfer.models import Weights
    from jaxinfer.runtime.ngram_rider import NgramLookup
    from jaxinfer.speculative.eagle import EagleConfig, EagleParams

# Plain decode steps in a row (at one row bucket; a multi-step call counts each) before a measuring
# verify step, at least. A measuring round costs a draft model ~7 plain steps at batch 1 on a CPU (one
# round, the catch-up on the positions decoded plainly): every 32 steps made a weak pair 0.76x plain,
# every 128 (16 default multi-step calls, the count before it was kept in steps) 0.95x.
REPROBE_STEPS = 128
# And at most this share of a bucket's time goes to measuring calls while speculation is off: at 64
# rows a measuring call, the draft's catch-up for every row included, cost 20-30 plain steps, and
# reprobing every 128 steps held a weak pair 10-17% below plain (issue 51 allows 3% at batch 64).
PROBE_SHARE = 0.01


@dataclasses.dataclass(frozen=True)
class EngineDraft:
    """A loaded draft model or EAGLE head (or the device's prompt lookup) for the engine: its shape,
    weights (a head's with the target's embedding and LM head; the lookup has none) and the cost of
    one draft step relative to a target decode step (the adaptive plan's input)."""

    cfg: ModelConfig | EagleConfig | NgramLookup
    weights: Weights | EagleParams | None
    cost: float


class Speculator:
    """Plans each row's drafts for one verify step and keeps acceptance per request."""

    def __init__(self, config: SpeculativeConfig, draft: EngineDraft | None = None):
        if config.drafts_on_host == (draft is not None):
            raise ValueError(f"method={config.method!r}: a draft model or head is loaded for 'draft', 'eagle', "
                             f"'mtp' and 'ngram_device' only (got {'one' if draft is not None else 'none'})")
        self.config = config
        self.suffix = None if config.method != "suffix" else SuffixDrafter(
            config.suffix_max_depth, config.suffix_max_cached_requests, config.suffix_max_cached_tokens,
            config.suffix_max_spec_factor, config.suffix_min_token_prob,
        )
        # Prompt lookup runs on the host: no draft steps to pay for. NumPy: the plan is made on the host.
        draft_cost = 0.0 if draft is None else draft.cost
        self.heuristic = on_host(heuristic_costs(draft_cost, config))
        self.measured = StepCosts(draft_cost) if config.calibrate else None
        self.plain_run: dict[int, int] = {}  # plain decode steps in a row since a verify step, per row bucket
        # Prompt-lookup drafts the plan declined for the coming plain step, by request id(): scored
        # for free against the tokens that step produces (`observe_plain`).
        self.declined: dict[int, np.ndarray] = {}
        # The last plan drafts for a row not measured yet, or is a reprobe: its verify call runs one
        # round (a draft model or head could run several), so finding out costs one round, not all.
        self.measuring = False
        self.totals = SpecMetrics(config.num_speculative_tokens)
        # Why no step speculates any more (`disable`: for good), and whether the last plan at the
        # plan's row bucket declined because drafting could not pay (it reprobes later).
        self.disabled_reason: str | None = None
        self.unpaid = False
        self.unpaid_at: dict[int, bool] = {}  # `unpaid` of the last plan at each row bucket
        self.declined_run: dict[int, int] = {}  # plans in a row at each row bucket that drafted nothing
        # Every row's outcomes folded into one moving average: what a new request's drafts are
        # expected to do until its own are measured (None: nothing measured yet, count on all).
        self.pair_acceptance: float | None = None

    @property
    def k_max(self) -> int:
        """Drafts per row at most."""
        return self.config.num_speculative_tokens

    def costs(self, rows: int) -> CostModel:
        """The cost model at this row bucket: measured once both kinds of step are timed, else the heuristic."""
        measured = None if self.measured is None else self.measured.cost_model(rows)
        return self.heuristic if measured is None else measured

    def plan(self, requests: list[Request], rows: int, most: int | None = None) -> list[np.ndarray] | None:
        """Drafts per request, or None when no row would draft (the step then decodes plainly).

        rows: the step's row bucket (costs are measured per bucket); most: drafts per row at most
        (the room its reserved pages leave; default k_max).
        """
        drafts = self._plan(requests, rows, most)
        self.unpaid_at[rows] = self.unpaid
        self.declined_run[rows] = 0 if drafts is not None else self.declined_run.get(rows, 0) + 1
        return drafts

    def _plan(self, requests: list[Request], rows: int, most: int | None) -> list[np.ndarray] | None:
        self.declined, self.measuring = {}, False
        if self.disabled_reason is not None:
            return None
        if self.suffix is not None:  # every request, so finished ones' outputs reach the shared tree
            self.suffix.track(requests)
        if any(r.params.penalized for r in requests):
            return None
        if self.config.adaptive and self.measured is not None and self.measured.needs_plain(rows):
            return None  # verify steps are timed: time plain ones too, which they must beat
        reprobe = self._reprobing(rows, requests)
        if self.config.adaptive and self._cannot_pay(rows) and not reprobe:
            self.unpaid = True  # no lookup or plan until the reprobe
            return None
        drafts = self._candidates(requests, self.k_max if most is None else min(most, self.k_max))
        if self.config.adaptive:
            drafts = self._adaptive(requests, drafts, rows, reprobe)
        if not any(len(d) for d in drafts):
            return None
        # A row whose draft is further behind than one call's catch-up would draft past a gap in its
        # draft's cache, and its acceptance would read low: it catches up first, drafting nothing.
        behind = [len(d) > 0 and self._lag(r) > CATCH_UP_SPAN for r, d in zip(requests, drafts)]
        drafts = [d[:0] if late else d for d, late in zip(drafts, behind)]
        drafting = any(len(d) for d in drafts)
        if self.config.adaptive and not reprobe and not drafting:
            return None  # catch-up calls the plan cannot price: only a reprobe (priced) pays for them
        self.measuring |= any(behind)  # a catch-up call runs one round
        if self.config.adaptive and drafting and not any(behind):
            self.plain_run[rows] = 0  # a reprobe goes on while any of its rows catches up
        return drafts

    def declines(self, requests: list[Request], rows: int, just_declined: bool = False) -> bool:
        """Whether the call after the one in flight decodes these rows plainly, whatever tokens the
        call in flight still adds (the engine asks before starting a plain call behind it, and plans
        on landed tokens when not). Host drafts (n-gram, suffix) depend on those tokens: only what
        they cannot change counts (speculation off, a row's sampling the verify step lacks, costs
        that cannot pay before the reprobe), and `just_declined`: the call in flight is plain
        because a plan on landed tokens declined, the second or later in a row at this bucket.
        Its rows' drafts then wait one call, so that while the text gives the lookup nothing every
        other plain call overlaps the host's work (the call after the chained one plans on landed
        tokens again); a request's first plans are not delayed (a short one would end first). A
        device drafter's plan reads only acceptance, costs and lags (and, for the device's lookup,
        the host's lookup on the tokens known): it is asked, and undone when it would draft."""
        if self.disabled_reason is not None or any(r.params.penalized for r in requests):
            return True
        if self.config.drafts_on_host:
            if just_declined and self.declined_run.get(rows, 0) >= 2:
                return True
            if not self.config.adaptive:
                return False
            untimed = self.measured is not None and self.measured.needs_plain(rows)
            return untimed or (self._cannot_pay(rows) and not self._reprobing(rows, requests))
        kept = (dict(self.plain_run), self.declined, self.measuring, self.unpaid, dict(self.unpaid_at),
                dict(self.declined_run))
        if self.plan(requests, rows) is None:
            return True
        self.plain_run, self.declined, self.measuring, self.unpaid, self.unpaid_at, self.declined_run = kept
        return False

    def drafts_chained(self, requests: list[Request], after_verify: bool) -> bool:
        """Whether a verify call of these rows may start before the call in flight lands: the device
        drafts them from where that call leaves them (`runtime/verify_carry`), which needs no
        catch-up there. The device's lookup reads a pool every step fills; a draft model or head is
        caught up only by a verify call, CATCH_UP_SPAN positions a row (after_verify: the call in
        flight verifies), so every row must be at most that far behind before it."""
        if self.config.drafts_on_host:
            return False
        if not self.config.catches_up:
            return True
        return after_verify and all(self._lag(r) <= CATCH_UP_SPAN for r in requests)

    def reads_prompts(self, rows: int) -> bool:
        """Whether a draft model or head reads the tokens of the ragged steps run now, whose rows will
        decode at row bucket `rows`: not while speculation is off for good, or while the last plan
        at that bucket found drafting cannot pay (at 64 rows the reads cost a draft model ~2% of
        plain throughput for drafts nobody makes). A row that does draft later first catches up
        (`CATCH_UP_SPAN` a call), priced into the reprobe."""
        if self.config.looks_up_on_device:  # the lookup stores every step's tokens (cheap)
            return True
        return self.disabled_reason is None and not (self.config.adaptive and self.unpaid_at.get(rows, False))

    def _candidates(self, requests: list[Request], most: int) -> list[np.ndarray]:
        """What each row could draft: host drafts (n-gram, suffix; for the device's lookup, what its
        first round finds), or placeholders a draft model or head fills on the device; at most
        `most`, never past max_tokens."""
        room = np.clip([r.max_total - r.num_tokens - 1 for r in requests], 0, most)
        if self.config.drafts_on_host:
            return [self._host_draft(r, int(k)) if k else np.zeros(0, np.int32) for r, k in zip(requests, room)]
        if self.config.model_free:  # the device's lookup: it drafts what the host's finds, then goes on
            return [self._host_draft(r, int(k)) if k and not r.masked_per_token else np.zeros(0, np.int32)
                    for r, k in zip(requests, room)]
        # Not for rows whose mask changes per token: their drafts would need masks the host cannot make in
        # advance. A fixed mask (allowed_token_ids, one-token bad words) is every drafted position's.
        return [np.zeros(0 if r.masked_per_token else k, np.int32) for r, k in zip(requests, room)]

    def _adaptive(
        self, requests: list[Request], drafts: list[np.ndarray], rows: int, reprobe: bool
    ) -> list[np.ndarray]:
        """The candidates cut to the plan's lengths (all of them on a reprobe); host drafts the plan
        declined are kept for `observe_plain`."""
        available = np.asarray([len(d) for d in drafts], np.int32)
        if not any(available):
            return drafts
        lengths = available if reprobe else self._planned_lengths(requests, available, rows)
        # One round would price the call's fixed cost as a round's (`StepCosts.needs_whole`): a batch
        # size's first calls run every round, and the device's lookup always does (its rounds cost
        # about a verify pass however its drafts fare).
        one_round = not self.config.looks_up_on_device and not (
            self.measured is not None and self.measured.needs_whole(rows))
        unmeasured = any(k and r.spec_acceptance is None for r, k in zip(requests, lengths))
        self.measuring = one_round and (reprobe or unmeasured)
        if not any(lengths) and self.config.model_free:
            self.declined = {id(r): d for r, d in zip(requests, drafts) if len(d)}
        self.unpaid = not any(lengths)
        return [d[:k] for d, k in zip(drafts, lengths)]

    def _host_draft(self, request: Request, k: int) -> np.ndarray:
        """At most k tokens from the request's tokens (n-gram) or the suffix trees (suffix)."""
        if self.suffix is not None:
            return self.suffix.draft(request, k)
        config = self.config
        return ngram_draft(np.asarray(request.all_ids, np.int32), k, config.ngram_min, config.ngram_max)

    def count_plain(self, rows: int, steps: int) -> None:
        """An all-decode call at this row bucket decoded `steps` steps plainly (toward the reprobe)."""
        self.plain_run[rows] = self.plain_run.get(rows, 0) + steps

    def _lag(self, request: Request) -> int:
        """Positions the request's draft model or head has not read (none for host drafts)."""
        return request.num_computed - request.draft_computed if self.config.catches_up else 0

    def _reprobing(self, rows: int, requests: list[Request]) -> bool:
        """True when this bucket ran REPROBE_STEPS plain steps in a row and measuring again costs at
        most PROBE_SHARE of them (a call per CATCH_UP_SPAN positions its drafts have not read, priced
        as its last one-round call): every row drafts once."""
        plain = self.plain_run.get(rows, 0)
        probe = None if self.measured is None else self.measured.probe_steps(rows)
        if plain < REPROBE_STEPS or probe is None:
            return plain >= REPROBE_STEPS
        calls = max(1, -(-max(map(self._lag, requests), default=0) // CATCH_UP_SPAN))
        return probe * calls <= PROBE_SHARE * plain

    def _cannot_pay(self, rows: int) -> bool:
        """True when even every draft accepted would not beat plain steps at this bucket's costs
        (the per-step lookup and plan, ~1 ms on a CPU, are then skipped)."""
        costs, k = self.costs(rows), np.arange(self.k_max + 1)
        cheapest = np.minimum(*(round_cost(rows, np.bool_(greedy), costs, self.k_max) for greedy in (True, False)))
        return bool(np.max((k[1:] + 1) / cheapest[1:]) < self.config.min_gain)

    def _planned_lengths(self, requests: list[Request], available: np.ndarray, rows: int) -> np.ndarray:
        """The batch's round plan from each row's acceptance and what it can draft (all 0: plain).

        A row not measured yet counts on the acceptance the engine's rows have had (full acceptance
        before any was measured): where the pair's drafts have been failing, a new request starts
        plain instead of paying a measuring round and the draft's read of its prompt. After
        REPROBE_STEPS plain steps every row drafts what it can, once, which measures it.
        """
        prior = 1.0 if self.pair_acceptance is None else self.pair_acceptance
        accept = np.asarray([prior if r.spec_acceptance is None else r.spec_acceptance for r in requests])
        greedy = all(r.params.temperature <= 0 for r in requests)
        return round_plan(
            np.repeat(accept[:, None], self.k_max, axis=1).astype(np.float32), available,
            np.ones(len(requests), bool), np.bool_(greedy), self.costs(rows), self.config.min_gain,
        )

    def disable(self, reason: str) -> None:
        """Stop speculating for good (the server's fallback); every later step decodes plainly."""
        self.disabled_reason = reason
        self.suffix = None  # no more drafts: let go of the tries and the requests they follow

    def fallback_reason(self) -> str | None:
        """Why steps do not speculate now: disabled, or the last plan found drafting does not pay."""
        if self.disabled_reason is not None:
            return self.disabled_reason
        return "does not pay at this batch size (the plan decodes plainly and reprobes)" if self.unpaid else None

    def metrics(self) -> dict:
        """Acceptance totals since the engine started (drafted, accepted, rates; see acceptance_summary)."""
        return speculation_metrics(self.config, self.disabled_reason is None, self.fallback_reason(), self.totals)

    def observe(
        self, requests: list[Request], drafted: np.ndarray, accepted: np.ndarray, planned: np.ndarray | None = None
    ) -> None:
        """Fold one step's outcome into each row's acceptance (kept on the request) and the totals.

        planned: the drafts the plan asked each row for, where the device's lookup may find fewer
        (drafted): the plan's acceptance is per planned draft, so a lookup that finds nothing reads
        as a rejection and the plan stops paying rounds for it; the totals count what was drafted.
        """
        for r, k, n in zip(requests, drafted if planned is None else planned, accepted):
            self._fold(r, int(k), int(n))
        counters = step_counters(drafted, accepted, self.k_max)
        self.totals.add(counters, len(requests))
        for row, r in enumerate(requests):
            base = r.spec_counts or zero_counts(self.k_max)
            r.spec_counts = {name: base[name] + counters[name][row] for name in counters}

    def observe_plain(self, produced: list[tuple[Request, np.ndarray]]) -> None:
        """Score the drafts the plan declined against the tokens the plain step then produced.

        A verify step would have kept exactly the drafts that equal the produced tokens for a
        greedy row, and for a sampled one draft i with probability p(draft i), which is also the
        chance that the sampled token equals it: the same acceptance, measured for free. So the
        estimates stay current while the engine decodes plainly, and one unlucky verify step
        does not keep a request's speculation off until the next reprobe. Not counted in the
        speculation totals (nothing was drafted).
        """
        declined, self.declined = self.declined, {}
        for request, tokens in produced:
            draft = declined.get(id(request))
            if draft is not None:  # drafts past the step's tokens were not tested
                self._fold(request, min(len(draft), len(tokens)), common_prefix(draft, tokens))

    def _fold(self, request: Request, drafted: int, accepted: int) -> None:
        """One outcome (accepted of drafted) into the request's moving average of acceptance."""
        if not drafted:
            return
        rate = accepted / (accepted + (accepted < drafted))  # n passed, and one failed unless all did
        decay = self.config.acceptance_decay
        request.spec_acceptance = moving_average(request.spec_acceptance, rate, decay)
        self.pair_acceptance = moving_average(self.pair_acceptance, rate, decay)
