"""A landed call's outputs applied to one request's row: its computed positions, its draft's
progress and its new tokens (host side, no jax)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxinfer.checkpoint.tokenizer import TokenTexts
from jaxinfer.engine.output_processor import append_token
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Row
from jaxinfer.runtime.host_step import HostStep, caught_up
from jaxinfer.sampling.logprob import position_logprobs

if TYPE_CHECKING:
    from jaxinfer.runtime.engine_step import StepOutputs


def advance_request(
    request: Request, row: Row, out: "StepOutputs", r: int, host: HostStep, texts: TokenTexts
) -> int:
    """Move the request past what row r computed and append what it sampled; how many tokens it took."""
    request.num_computed = row.start + row.count
    if host.draft_reads and host.drafts is None and not host.decode and request.draft_computed == row.start:
        request.draft_computed = request.num_computed  # a ragged step: a draft model read its tokens
    if not row.samples:
        return 0
    produced = append_row_tokens(request, out, r, texts)
    if host.drafts is not None:  # the verify rounds' draft (model) read every position they computed...
        # ...unless its catch-up was cut short (CATCH_UP_SPAN positions a call): the rest comes next time;
        # a chained call's (carried) needed none: the call ahead of it left the draft caught up
        carried = host.carried is not None and host.carried[r]
        caught = row.start if carried else caught_up(int(host.draft_start[r]), row.start)
        request.draft_computed = request.num_computed if caught >= row.start else caught
    return produced


def append_row_tokens(request: Request, out: "StepOutputs", r: int, texts: TokenTexts) -> int:
    """Append row r's new tokens (and logprobs) until the request finishes; how many it took.

    Text waits for the outputs to be built (output_processor.catch_up_text), except with stop
    strings, which can end the request at any token.
    """
    count = int(out.counts[r]) if out.tokens.shape[1] > 1 else 1
    per_token = bool(request.params.stop)
    for j in range(count):
        if j:
            request.num_computed += 1
        if out.logprobs is not None and request.params.logprobs is not None:
            k = request.params.logprobs
            request.logprobs.append(position_logprobs(
                int(out.tokens[r, j]), out.logprobs[r, j], int(out.ranks[r, j]), out.top_ids[r, j, :k].tolist(),
                out.top_logprobs[r, j, :k].tolist(), texts,
            ))
        if append_token(request, int(out.tokens[r, j]), detokenize=per_token):
            return j + 1
    return count
