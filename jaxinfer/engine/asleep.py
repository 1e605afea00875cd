"""The error of work sent to an engine whose weights `LLM.sleep` freed."""

from __future__ import annotations


class EngineAsleep(RuntimeError):
    """The engine has no weights to run: asleep (`level` 1: wake_up brings them back) or its weights
    discarded (level 2: an update brings new ones); the message says so to a Python caller."""

    def __init__(self, message: str, level: int):
        super().__init__(message)
        self.level = level
