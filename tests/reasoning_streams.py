"""What a streamed chat completion under a reasoning parser sends, per choice."""

from __future__ import annotations

from typing import Any, Iterable


def stream_parts(chunks: Iterable[Any], n: int) -> list[tuple[str, str]]:
    """Each choice's reasoning and content deltas, joined; every delta names its reasoning under both fields."""
    parts = [["", ""] for _ in range(n)]
    for chunk in chunks:
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            assert extra.get("reasoning") == extra.get("reasoning_content")
            parts[choice.index][0] += extra.get("reasoning_content") or ""
            parts[choice.index][1] += choice.delta.content or ""
    return [tuple(p) for p in parts]
