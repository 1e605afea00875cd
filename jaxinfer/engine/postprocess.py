"""After a step: append a sample's new tokens, detokenize, and decide whether it finished (no jax).

Finish rules, checked token by token in this order: a stop token id (EOS unless ignore_eos,
and stop_token_ids) once min_tokens are out; max_tokens; a structured-output constraint that is
complete (nothing may follow it: "stop"); a stop string in the text (cut from the output, or kept
as its end with include_stop_str_in_output). While a stop string could
still be completing, its possible start is held back from streamed deltas.
"""

from __future__ import annotations

from jaxinfer.engine.request import Request


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
