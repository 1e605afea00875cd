"""After a step: append a sample's new tokens, detokenize, decide whether it finished, and make the
RequestOutput deltas of what is new since a request's last output (host side, no jax).

Finish rules, checked token by token in this order: a stop token id (EOS unless ignore_eos,
and stop_token_ids) once min_tokens are out; max_tokens; a structured-output constraint that is
complete (nothing may follow it: "stop"); a stop string in the text (cut from the output, or kept
as its end with include_stop_str_in_output). While a stop string could
still be completing, its possible start is held back from streamed deltas.
"""

from __future__ import annotations

from jaxinfer.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from jaxinfer.engine.request import Request
from jaxinfer.speculative.acceptance_summary import summarize


def append_token(request: Request, token: int, detokenize: bool = True) -> bool:
    """Add one generated token; True when it ends the request (request.finish is called).

    detokenize=False leaves the text to a later token's call (or the finishing one): the
    Detokenizer gives the same text for ids pushed one by one or several at a time.
    """
    request.output_ids.append(token)
    generated = len(request.output_ids)
    if token in request.stop_ids and generated > request.params.min_tokens:
        eos = token not in request.params.stop_token_ids
        request.finish("stop", None if eos else token)
    elif generated >= request.params.max_tokens:
        request.finish("length")
    if request.grammar is not None and not request.finished:
        request.grammar.accept(token)
        if request.grammar.stopped:  # only an end-of-sequence token may follow: stop now, not a step later
            request.finish("stop")
    if detokenize or request.finished:
        _detokenize(request)
    return request.finished


def catch_up_text(request: Request) -> None:
    """Text for the tokens appended with detokenize=False (done when outputs are built: under
    overlap_outputs, while the device runs the next call). Stop strings' requests are detokenized
    token by token as they go."""
    if not request.params.stop:
        _detokenize(request)


def _detokenize(request: Request) -> None:
    """Extend request.text with the new text and apply stop strings."""
    if request.detokenizer is None:
        return
    searched_from = len(request.text)
    request.text += request.detokenizer.push(request.output_ids)
    if request.finished:
        request.text += request.detokenizer.flush()
    stops = request.params.stop
    if not stops or len(request.output_ids) <= request.params.min_tokens:
        return
    longest = max(map(len, stops))
    window_start = max(0, searched_from - longest + 1)
    hits = [(request.text.find(s, window_start), s) for s in stops]
    hits = [(at, s) for at, s in hits if at >= 0]
    if hits:
        at, stop = min(hits)
        end = at + len(stop) if request.params.include_stop_str_in_output else at
        request.text = request.text[:end]
        request.finish("stop", stop)


def visible_text_end(request: Request) -> int:
    """How much of request.text may be streamed: all once finished, else minus a possible stop-string start."""
    stops = request.params.stop
    if request.finished or not stops:
        return len(request.text)
    return max(request.emitted_chars, len(request.text) - max(map(len, stops)) + 1)


def _completion_delta(request: Request) -> CompletionOutput:
    end = visible_text_end(request)
    text = request.text[request.emitted_chars : end]
    ids = request.output_ids[request.emitted_tokens :]
    logprobs = request.logprobs[request.emitted_tokens :] if request.params.logprobs is not None else None
    request.emitted_chars, request.emitted_tokens = end, len(request.output_ids)
    spec_stats = summarize(request.spec_counts) if request.spec_counts else None
    if logprobs is not None:  # only the new tokens: a stream's deltas never sum the whole output again
        request.cumulative_logprob += sum(top[token].logprob for top, token in zip(logprobs, ids))
    cumulative = None if logprobs is None else request.cumulative_logprob
    return CompletionOutput(
        request.index, text, ids, request.finish_reason, request.stop_reason, logprobs, spec_stats, cumulative
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
        num_cached_tokens=leader.num_cached_tokens,
    )
