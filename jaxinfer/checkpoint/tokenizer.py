"""Tokenizer loading (HF files) and incremental detokenization for streaming."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Sequence

GENERIC_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
INCOMPLETE = "\ufffd"  # what a decoder returns for the bytes of a character not yet complete


def load_tokenizer(model_dir: Path) -> Any | None:
    """The model's HF tokenizer, or None when the directory ships no tokenizer files."""
    if not any((model_dir / m).is_file() for m in TOKENIZER_MARKERS):
        return None
    from jaxinfer.checkpoint.hf_import import auto_tokenizer

    generic = _generic_class(model_dir)
    loader = _generic_loader(generic) if generic is not None else None
    return (loader or auto_tokenizer()).from_pretrained(str(model_dir))


def _generic_loader(name: str) -> Any | None:
    """transformers' generic fast tokenizer class by the name given, else by its other name: TokenizersBackend is
    transformers 5's, which transformers 4 (PreTrainedTokenizerFast) lacks and its AutoTokenizer refuses."""
    from jaxinfer.checkpoint.hf_import import tokenizer_class

    for candidate in (name, *GENERIC_CLASSES):
        try:
            return tokenizer_class(candidate)
        except AttributeError:
            continue
    return None


def load_tokenizer_beside(model_dir: Path) -> Future:
    """`load_tokenizer(model_dir)` started on a daemon thread (importing transformers takes ~1.8 s:
    done while the weights load). A daemon, not a pool's worker: the interpreter's exit joins those,
    and a start interrupted while the main thread held an import lock leaves this load waiting on it
    forever (a `jaxinfer serve` stopped while loading hung so)."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(load_tokenizer(model_dir))
        except BaseException as error:  # the caller's result() raises it
            future.set_exception(error)

    threading.Thread(target=run, name="tokenizer", daemon=True).start()
    return future


def _generic_class(model_dir: Path) -> str | None:
    """The tokenizer's class when it is transformers' generic fast tokenizer over tokenizer.json
    (Llama 3's, for one), else None (AutoTokenizer resolves it).

    AutoTokenizer would pick the same class, but on the way it imports transformers' model
    configuration code and with it PyTorch where installed: ~3 s of a server's start.
    """
    config = model_dir / "tokenizer_config.json"
    if not (model_dir / "tokenizer.json").is_file() or not config.is_file():
        return None
    try:
        name = json.loads(config.read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        return None
    return name if name in GENERIC_CLASSES else None


def decode_text(tokenizer: Any, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Generated ids -> text, exactly as the Detokenizer's pieces join up; special tokens left out unless
    skip_special_tokens=False.

    Clean-up of tokenization spaces is off: it rewrites text already emitted (" ," -> ","),
    so a stream could never agree with it, and for byte-level BPE it corrupts code.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # a fast tokenizer: what its decode returns, without the wrapper's per-call cost
        return backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
    return tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens,
                            clean_up_tokenization_spaces=False)


class Detokenizer:
    """Turns a growing list of token ids into new text pieces, never splitting a UTF-8 character.

    Prefix-offset scheme: each call decodes only a short window of recent ids, ids[prefix:],
    and emits what it adds to the text of ids[prefix:read]. Decoding the window with the same
    left context keeps leading-space rules consistent, and the cost per call follows the new
    tokens, not the length of the sequence.
    """

    def __init__(self, tokenizer: Any | None, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._prefix = 0  # window start: context for the decoder, already emitted
        self._read = 0  # ids before this are emitted
        self._window: list[int] = []  # ids[prefix:] at the last push

    def push(self, token_ids: Sequence[int]) -> str:
        """All ids generated so far -> the text not yet returned (held back at a partial character)."""
        if self._tokenizer is None or len(token_ids) <= self._read:
            return ""
        self._window = list(token_ids[self._prefix :])
        before, text = self._window_texts()
        if text.endswith(INCOMPLETE) or len(text) <= len(before):
            return ""
        self._window = self._window[self._read - self._prefix :]
        self._prefix, self._read = self._read, len(token_ids)
        return text[len(before) :]

    def flush(self) -> str:
        """Whatever is left once generation ends (a trailing partial character included); every id
        pushed so far counts as emitted after it, so pushing them again adds nothing."""
        if self._tokenizer is None or not self._window:
            return ""
        before, text = self._window_texts()
        self._prefix = self._read = self._prefix + len(self._window)
        self._window = []
        return text[len(before) :]

    def _window_texts(self) -> tuple[str, str]:
        """Text of the already-emitted context ids[prefix:read] and of the whole window."""
        emitted = self._read - self._prefix
        skip = self._skip_special
        return (decode_text(self._tokenizer, self._window[:emitted], skip),
                decode_text(self._tokenizer, self._window, skip))



class TokenTexts:
    """Each token's own text (what logprobs name a token by), decoded once per id.

    Special tokens keep their text (a logprob of EOS should say so); None without a tokenizer.
    """

    def __init__(self, tokenizer: Any | None):
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str | None:
        if self._tokenizer is None:
            return None
        text = self._texts.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            self._texts[token_id] = text
        return text
