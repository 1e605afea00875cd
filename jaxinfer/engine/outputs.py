"""What the engine returns, in vLLM's shape: one RequestOutput per request, one CompletionOutput per sample."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxinfer.sampling.logprob import Logprob


@dataclasses.dataclass
class CompletionOutput:
    """One sample: its text and ids (all so far, or only the new part for streaming deltas).

    A delta carries every sample of its request: the new text and ids (empty when the sample made
    no progress) and, once it finished, its finish reason.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"; None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    logprobs: list[dict[int, Logprob]] | None = None  # per generated token: top ids and the token -> Logprob
    spec_stats: dict | None = None  # speculative acceptance for this sample (None when plain)
    # vLLM's: the summed log-probability of every token generated so far (None unless logprobs were asked)
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        """True once a finish reason is set."""
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestMetrics:
    """Per-request latencies in seconds (None until known)."""

    arrival_time: float
    queue_time: float | None = None
    time_to_first_token: float | None = None
    time_per_output_token: float | None = None
    e2e_latency: float | None = None


@dataclasses.dataclass
class RequestOutput:
    """A request's samples; `.text`, `.token_ids`, `.finish_reason`, `.spec_stats` read sample 0."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: RequestMetrics | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # per prompt token (None for the first)
    error: str | None = None  # why the request failed, when finish_reason is "error"
    num_cached_tokens: int | None = None  # vLLM's: prompt tokens served by the prefix cache (None: not scheduled yet)

    @property
    def text(self) -> str:
        """Text of sample 0."""
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        """Generated ids of sample 0."""
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        """Finish reason of sample 0."""
        return self.outputs[0].finish_reason

    @property
    def spec_stats(self) -> dict | None:
        """Speculative statistics of sample 0."""
        return self.outputs[0].spec_stats


def accumulate(total: RequestOutput | None, delta: RequestOutput) -> RequestOutput:
    """Fold a delta into the running total of a request (text and ids appended, status replaced)."""
    if total is None:
        return dataclasses.replace(delta, outputs=[dataclasses.replace(o) for o in delta.outputs])
    by_index = {o.index: o for o in total.outputs}
    for new in delta.outputs:
        old = by_index[new.index]
        old.text += new.text
        old.token_ids = old.token_ids + new.token_ids
        if new.logprobs is not None:
            old.logprobs = (old.logprobs or []) + new.logprobs
        old.finish_reason, old.stop_reason = new.finish_reason, new.stop_reason
        old.spec_stats = new.spec_stats or old.spec_stats  # totals so far, not a delta
    total.finished, total.metrics = delta.finished, delta.metrics
    total.error = total.error or delta.error
    return total


@dataclasses.dataclass
class EmbeddingOutput:
    """A prompt's embedding (vLLM's EmbeddingOutput)."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclasses.dataclass
class EmbeddingRequestOutput:
    """What `LLM.embed` returns per prompt (vLLM's EmbeddingRequestOutput)."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclasses.dataclass
class PoolingOutput:
    """A prompt's pooled vector as `LLM.encode` returns it (vLLM's PoolingOutput; a NumPy array, not a torch
    tensor): an embedding, or a classifier's probabilities (its logits with use_activation=False)."""

    data: np.ndarray


@dataclasses.dataclass
class PoolingRequestOutput:
    """What `LLM.encode` returns per prompt (vLLM's PoolingRequestOutput)."""

    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclasses.dataclass
class ClassificationOutput:
    """A prompt's class probabilities, in label order (vLLM's ClassificationOutput)."""

    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclasses.dataclass
class ClassificationRequestOutput:
    """What `LLM.classify` returns per prompt (vLLM's ClassificationRequestOutput)."""

    request_id: str
    outputs: ClassificationOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclasses.dataclass
class ScoringOutput:
    """A pair's score (vLLM's ScoringOutput): a cross-encoder's probability, or two embeddings' cosine."""

    score: float


@dataclasses.dataclass
class ScoringRequestOutput:
    """What `LLM.score` returns per pair (vLLM's ScoringRequestOutput); prompt_token_ids: the pair's tokens."""

    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool = True
