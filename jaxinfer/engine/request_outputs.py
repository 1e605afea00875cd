"""RequestOutput deltas from request state: what is new since the last output (host side, no jax)."""

from __future__ import annotations

from jaxinfer.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from jaxinfer.engine.postprocess import visible_text_end
from jaxinfer.engine.request import Request
from jaxinfer.speculative.acceptance_summary import summarize


def _completion_delta(request: Request) -> CompletionOutput:
    end = visible_text_end(request)
    text = request.text[request.emitted_chars : end]
    ids = request.output_ids[request.emitted_tokens :]
    logprobs = request.logprobs[request.emitted_tokens :] if request.params.logprobs is not None else None
    request.emitted_chars, request.emitted_tokens = end, len(request.output_ids)
    spec_stats = summarize(request.spec_counts) if request.spec_counts else None
    return CompletionOutput(
        request.index, text, ids, request.finish_reason, request.stop_reason, logprobs, spec_stats
    )


def _metrics(leader: Request) -> RequestMetrics:
    t = leader.timing
    out = RequestMetrics(arrival_time=t.arrival)
    if t.first_scheduled is not None:
        out.queue_time = t.first_scheduled - t.arrival
    if t.first_token is not None:
        out.time_to_first_token = t.first_token - t.arrival
    if t.finished is not None:
        out.e2e_latency = t.finished - t.arrival
        if len(leader.output_ids) > 1 and t.last_token is not None and t.first_token is not None:
            out.time_per_output_token = (t.last_token - t.first_token) / (len(leader.output_ids) - 1)
    return out


def delta_output(group: list[Request]) -> RequestOutput:
    """The new text/ids of every sample of a request since its previous output."""
    leader = group[0]
    first = leader.emitted_tokens == 0 and leader.emitted_chars == 0
    errors = [r.error for r in group if r.error]
    return RequestOutput(
        request_id=leader.request_id,
        prompt=leader.prompt,
        prompt_token_ids=leader.prompt_ids,
        outputs=[_completion_delta(r) for r in group],
        finished=all(r.finished for r in group),
        metrics=_metrics(leader),
        prompt_logprobs=leader.prompt_logprobs if first else None,
        error=errors[0] if errors else None,
    )
