"""Bounds on what one request may ask for (`jaxinfer serve --max-n ...`): a 400 naming the field past one.

The body size bounds the bytes a request carries; these bound the work it asks for: samples,
generated tokens, logprobs per token, stop lists and prompts per call. Each default is the
engine's own ceiling or a generous one, so the server refuses nothing the engine would run,
and an operator lowers them to fit a deployment.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from jaxinfer.config import validation
from jaxinfer.config.sampling_params import MAX_LOGPROBS, MAX_N
from jaxinfer.entrypoints.openai.errors import APIError

DEFAULT_MAX_STOP = 16  # entries in `stop` and in `stop_token_ids`, each
DEFAULT_MAX_PROMPTS = 256  # prompts of one /v1/completions call


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-request bounds; each field is the flag of the same name (`max_n`: `--max-n`)."""

    max_n: int = MAX_N
    max_tokens: int | None = None  # None: what the context leaves
    max_logprobs: int = MAX_LOGPROBS
    max_stop: int = DEFAULT_MAX_STOP
    max_prompts: int = DEFAULT_MAX_PROMPTS

    def __post_init__(self) -> None:
        validation.integer(self.max_n, "--max-n", 1, MAX_N)
        if self.max_tokens is not None:
            validation.integer(self.max_tokens, "--max-tokens-limit", 1)
        validation.integer(self.max_logprobs, "--max-logprobs", 0, MAX_LOGPROBS)
        validation.integer(self.max_stop, "--max-stop-sequences", 0)
        validation.integer(self.max_prompts, "--max-prompts", 1)

    def check(self, body: object, prompts: int = 1) -> None:
        """400 naming the first field of `body` (a request model) past its bound."""
        _at_most("n", getattr(body, "n", 1), self.max_n, "--max-n")
        for field in ("max_tokens", "max_completion_tokens"):
            value = getattr(body, field, None)
            if value is not None and self.max_tokens is not None:
                _at_most(field, value, self.max_tokens, "--max-tokens-limit")
        for field in ("logprobs", "top_logprobs"):
            value = getattr(body, field, None)
            if isinstance(value, int) and not isinstance(value, bool):  # chat's logprobs is a bool
                _at_most(field, value, self.max_logprobs, "--max-logprobs")
        _at_most("stop", len(_stop_list(getattr(body, "stop", None))), self.max_stop, "--max-stop-sequences",
                 "entries")
        _at_most("stop_token_ids", len(getattr(body, "stop_token_ids", None) or ()), self.max_stop,
                 "--max-stop-sequences", "entries")
        _at_most("prompt", prompts, self.max_prompts, "--max-prompts", "prompts")

    def default_max_tokens(self, room: int) -> int:
        """max_tokens of a request that gives none: what the context leaves, within --max-tokens-limit."""
        return room if self.max_tokens is None else min(room, self.max_tokens)


def _stop_list(stop: str | Sequence[str] | None) -> Sequence[str]:
    if stop is None:
        return ()
    return [stop] if isinstance(stop, str) else stop


def _at_most(field: str, value: int, bound: int, flag: str, unit: str = "") -> None:
    if value > bound:
        what = f"{value} {unit}".strip()
        raise APIError(f"{field}: {what} is over this server's limit of {bound} ({flag}); accepted: at most {bound}",
                       param=field)
