"""Tokenizer loading (HF files) and incremental detokenization for streaming."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def load_tokenizer(model_dir: Path) -> Any | None:
    """The model's HF tokenizer, or None when the directory ships no tokenizer files."""
    if not any((model_dir / m).is_file() for m in TOKENIZER_MARKERS):
        return None
    from jaxinfer.hf_import import auto_tokenizer

    return auto_tokenizer().from_pretrained(str(model_dir))


class Detokenizer:
    """Turns a growing list of token ids into new text pieces, never splitting a UTF-8 character."""

    def __init__(self, tokenizer: Any | None):
        self._tokenizer = tokenizer
        self._emitted = ""
        self._text = ""

    def push(self, token_ids: list[int]) -> str:
        """All ids generated so far -> the text not yet returned (held back at a partial character)."""
        if self._tokenizer is None:
            return ""
        self._text = self._tokenizer.decode(token_ids, skip_special_tokens=True)
        ready = self._text[: -1] if self._text.endswith("\ufffd") else self._text
        if not ready.startswith(self._emitted):
            return ""
        piece, self._emitted = ready[len(self._emitted) :], ready
        return piece

    def flush(self) -> str:
        """Whatever is left once generation ends."""
        piece = self._text[len(self._emitted) :] if self._text.startswith(self._emitted) else ""
        self._emitted = self._text
        return piece
