"""One sequence's life in the engine: waiting -> running -> finished (or back to waiting when preempted).

Plain Python, no jax. A request with `n > 1` samples is a group of `Request`s that share the
prompt (and, through the prefix cache, its pages); each carries its own output and seed.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import TYPE_CHECKING

from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.runtime.image_input import ImageInput, cache_keys, whole_prompt_keys
from jaxinfer.sampling.logprob import Logprob

if TYPE_CHECKING:
    from jaxinfer.engine.structured.request_grammar import RequestGrammar  # structured imports the scheduler


class Status(enum.Enum):
    """Where a request is in the scheduler."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass
class Timing:
    """Wall-clock marks (time.monotonic seconds) for the latency metrics."""

    arrival: float = dataclasses.field(default_factory=time.monotonic)
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    token_gaps: list[float] = dataclasses.field(default_factory=list)  # inter-token latencies

    def record_tokens(self, count: int, now: float) -> None:
        """Note `count` new tokens produced at `now` (a multi-step call spreads its gap over them)."""
        if count <= 0:
            return
        if self.first_token is None:
            self.first_token = now
            count -= 1
        elif self.last_token is not None:
            self.token_gaps += [(now - self.last_token) / count] * count
            count = 0
        self.token_gaps += [0.0] * count
        self.last_token = now


@dataclasses.dataclass
class Request:
    """One sample of one user request, with everything the scheduler and output builder need."""

    request_id: str
    index: int  # sample index within the group (0 .. n-1)
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    stop_ids: tuple[int, ...]  # EOS (unless ignore_eos) and stop_token_ids
    leader: "Request | None" = None  # sample 0 of the group: later samples wait for its prefill
    output_ids: list[int] = dataclasses.field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int | None = None  # prompt tokens its first admission found cached (device or host tier)
    pages: list[int] = dataclasses.field(default_factory=list)
    page_hashes: list[bytes] = dataclasses.field(default_factory=list)  # chained hashes of full pages
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None
    error: str | None = None  # why it failed, when finish_reason is "error"
    text: str = ""  # full output text so far (stop strings cut it)
    emitted_chars: int = 0  # prefix of `text` already sent as deltas
    emitted_tokens: int = 0
    logprobs: list[dict[int, Logprob]] = dataclasses.field(default_factory=list)
    cumulative_logprob: float = 0.0  # of the tokens sent so far (summed as each delta is made: once each)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    timing: Timing = dataclasses.field(default_factory=Timing)
    detokenizer: object | None = None
    adapter: str | None = None  # the LoRA adapter it runs with (its key, config.lora.adapter_key), None: base model
    adapter_slot: int = -1  # the device slot holding that adapter while it runs (engine/adapter_slots)
    spec_acceptance: float | None = None  # moving average of draft acceptance (engine speculation)
    spec_counts: dict | None = None  # this sample's verify-step counters (acceptance_summary.COUNTER_FIELDS)
    # Leading positions whose draft-model K/V are written: plain decode calls leave the draft
    # behind, the next verify step catches it up (runtime/draft_model_rider.catch_up).
    draft_computed: int = 0
    grammar: "RequestGrammar | None" = None  # where the output is in its structured_outputs constraint
    streamed: bool = False  # someone reads its tokens as they come: calls run at most stream_interval steps
    images: tuple[ImageInput, ...] = ()  # the prompt's images (a vision-language model's), by placeholder range
    # [sum of the images' lengths, D] float32: their features, made by the runner when first scheduled and kept
    # through preemption (None until then)
    image_rows: object | None = None
    audio: object | None = None  # [mel bins, frames] float32 log-mel features (an encoder-decoder model's)
    priority: int = 0  # vLLM's: under scheduling_policy "priority", lower values are admitted first
    # The prompt is one bidirectional prefix (PaliGemma's): its tokens see up to its end, one prefill chunk computes
    # it whole, and its pages are keyed by all of it (a prompt token's K/V depend on every later prompt token)
    whole_prompt: bool = False

    @property
    def all_ids(self) -> list[int]:
        """Prompt then output ids: what the cache must hold when the request is fully computed."""
        return self.prompt_ids + self.output_ids

    @property
    def known_prompt_ids(self) -> list[int]:
        """The prompt's real token ids (repetition penalties count them): none where its rows were given
        (prompt_embeds: its ids are placeholders)."""
        return [] if any(image.rows is not None for image in self.images) else self.prompt_ids

    @property
    def cache_ids(self) -> list[int | str]:
        """all_ids as prefix caching keys them: image placeholders by their image's content hash; a whole-prompt
        prefix's first position by all of the prompt (every page chains from it)."""
        keys = cache_keys(self.all_ids, self.images)
        return whole_prompt_keys(keys, len(self.prompt_ids)) if self.whole_prompt else keys

    def ids_between(self, start: int, end: int) -> list[int]:
        """all_ids[start:end] without building all_ids (a decode step reads one or two ids of hundreds)."""
        prompt = len(self.prompt_ids)
        if end <= prompt:
            return self.prompt_ids[start:end]
        if start >= prompt:
            return self.output_ids[start - prompt : end - prompt]
        return self.prompt_ids[start:] + self.output_ids[: end - prompt]

    @property
    def masked_per_token(self) -> bool:
        """True when the output's token mask changes with each token (`RequestGrammar.per_token`): the host makes
        each mask, so the request decodes one step a call and drafts nothing; a fixed mask holds at every step."""
        return self.grammar is not None and self.grammar.per_token

    @property
    def num_tokens(self) -> int:
        """Prompt plus output length."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefilling(self) -> bool:
        """True while some prompt (or recomputed) tokens are not yet in the cache."""
        return self.num_computed < self.num_tokens - 1

    @property
    def max_total(self) -> int:
        """The length at which the request ends by max_tokens."""
        return len(self.prompt_ids) + self.params.max_tokens

    @property
    def finished(self) -> bool:
        """True once the request needs no more steps."""
        return self.status is Status.FINISHED

    @property
    def ready(self) -> bool:
        """False for a group's later samples until the leader's prompt is in the cache (they share it)."""
        return self.leader is None or self.leader.finished or not self.leader.prefilling

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        """Mark finished; the engine frees its pages."""
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.timing.finished = time.monotonic()
