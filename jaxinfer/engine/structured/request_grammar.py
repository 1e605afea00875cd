"""One request's place in its constraint: an llguidance matcher advanced by each accepted token, beside
its token filter (allowed_token_ids, bad_words).

Host only, no jax. The matcher follows the request's output ids, which preemption keeps (the
request recomputes its K/V, not its tokens), so a preempted request resumes where it was.
"""

from __future__ import annotations

from typing import Any

from jaxinfer.engine.structured.token_filter import TokenFilter


class RequestGrammar:
    """The matcher of one sample (each of a request's n samples has its own), and its token filter
    (allowed_token_ids, bad_words); either may be None, not both."""

    def __init__(self, matcher: Any | None, kind: str, token_filter: TokenFilter | None = None):
        self.matcher = matcher
        self.kind = kind  # the constraint's kind, for error messages
        self.token_filter = token_filter

    def accept(self, token: int) -> None:
        """Advance by a generated token; a token the constraint forbids is a ValueError (the mask should
        have made it impossible, so this is a bug or a token the tokenizer does not know)."""
        if self.matcher is not None and not self.matcher.consume_token(token):
            raise ValueError(f"token {token} breaks the structured_outputs.{self.kind} constraint: "
                             f"{self.matcher.get_error()}")
        if self.token_filter is not None:
            self.token_filter.accept(token)

    @property
    def per_token(self) -> bool:
        """True when the mask changes with each generated token (a matcher, or bad words of several
        tokens): such a row decodes one step per device call, since the host makes each mask."""
        return self.matcher is not None or not self.token_filter.static

    @property
    def stopped(self) -> bool:
        """True when the constraint is complete and nothing may follow (the request then stops)."""
        return self.matcher is not None and bool(self.matcher.is_stopped())
