"""One request's place in its constraint: an llguidance matcher advanced by each accepted token.

Host only, no jax. The matcher follows the request's output ids, which preemption keeps (the
request recomputes its K/V, not its tokens), so a preempted request resumes where it was.
"""

from __future__ import annotations

from typing import Any


class RequestGrammar:
    """The matcher of one sample (each of a request's n samples has its own)."""

    def __init__(self, matcher: Any, kind: str):
        self.matcher = matcher
        self.kind = kind  # the constraint's kind, for error messages

    def accept(self, token: int) -> None:
        """Advance by a generated token; a token the constraint forbids is a ValueError (the mask should
        have made it impossible, so this is a bug or a token the tokenizer does not know)."""
        if not self.matcher.consume_token(token):
            raise ValueError(f"token {token} breaks the structured_outputs.{self.kind} constraint: "
                             f"{self.matcher.get_error()}")

    @property
    def stopped(self) -> bool:
        """True when the constraint is complete and nothing may follow (the request then stops)."""
        return bool(self.matcher.is_stopped())
