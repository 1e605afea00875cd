"""Constraints compiled by llguidance (the `structured` extra), cached per constraint for one tokenizer.

Host only, no jax. Compiling a constraint builds an llguidance matcher (the grammar's parser and
lexer over this tokenizer); each request then starts from a copy of that matcher (microseconds),
so a schema many requests share is compiled once. Why llguidance and not xgrammar:
docs/structured_output.md.
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Any, Sequence

from jaxinfer.config.structured_outputs import StructuredOutputsParams

EXTRA_HINT = "structured output needs llguidance: pip install 'jaxinfer[structured]'"
CACHE_SIZE = 256  # compiled constraints kept (least recently used dropped first)
# Compact separators: a small model left free to add whitespace after every item can spend its
# whole max_tokens on spaces and newlines inside a valid but never-finished object.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def llguidance_module() -> Any:
    """The llguidance package, or an ImportError naming the extra to install."""
    try:
        import llguidance
        import llguidance.hf
        import llguidance.numpy
    except ImportError:
        raise ImportError(EXTRA_HINT) from None
    return llguidance


def grammar_text(params: StructuredOutputsParams) -> str:
    """The constraint as an llguidance grammar (its JSON text); ValueError naming the field when it is malformed."""
    llg = llguidance_module()
    kind, spec = params.kind, params.spec
    try:
        if kind in ("json", "json_object"):
            schema = json.loads(spec) if kind == "json" else {"type": "object"}
            if isinstance(schema, dict):
                schema = {"x-guidance": JSON_OPTIONS, **schema}
            return llg.LLMatcher.grammar_from_json_schema(schema)
        if kind == "choice":
            return llg.grammar_from("lark", "start: " + " | ".join(json.dumps(c) for c in params.choice))
        return llg.grammar_from("regex" if kind == "regex" else "grammar", spec)
    except (ValueError, RuntimeError) as error:
        raise ValueError(f"structured_outputs.{kind} does not compile: {error}") from None


class GrammarCache:
    """Compiled constraints for one tokenizer, keyed by (kind, spec); safe to use from several threads."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int] = ()):
        self._hf_tokenizer, self.vocab_size = tokenizer, vocab_size
        self.eos_token_ids = list(eos_token_ids)  # the model's (else the tokenizer's): what may end a constraint
        self._tokenizer: Any = None  # llguidance's view of the vocabulary, built on first use (~1 s at 128k)
        self._compiled: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> Any:
        """llguidance's tokenizer over vocab_size ids (ids the tokenizer lacks are never allowed)."""
        with self._lock:
            if self._tokenizer is None:
                if self._hf_tokenizer is None:
                    raise ValueError("structured_outputs needs the model's tokenizer; this model directory has none")
                llg = llguidance_module()
                self._tokenizer = llg.hf.from_tokenizer(
                    self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_token_ids or None
                )
            return self._tokenizer

    def matcher(self, params: StructuredOutputsParams) -> Any:
        """A fresh llguidance matcher for params (compiled once, then copied); ValueError when it does not compile."""
        key = (params.kind, params.spec)
        with self._lock:
            template = self._compiled.get(key)
            if template is not None:
                self._compiled.move_to_end(key)
        if template is None:
            template = self._compile(params)
            with self._lock:
                self._compiled[key] = template
                while len(self._compiled) > CACHE_SIZE:
                    self._compiled.popitem(last=False)
        return template.deep_copy()

    def _compile(self, params: StructuredOutputsParams) -> Any:
        llg = llguidance_module()
        tokenizer = self.tokenizer
        grammar = grammar_text(params)
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if failed:
            raise ValueError(f"structured_outputs.{params.kind} does not compile: {messages[0]}")
        matcher = llg.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"structured_outputs.{params.kind} does not compile: {matcher.get_error()}")
        return matcher
