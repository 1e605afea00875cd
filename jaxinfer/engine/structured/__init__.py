"""Structured output on the host: constraints compiled once per (constraint, tokenizer), a matcher per
request advanced as tokens are accepted, and each step's packed token bitmask.

No jax: the step programs apply the mask (`sampling.token_bitmask`); this package only fills it.
"""

from jaxinfer.engine.structured.grammars import EXTRA_HINT, GrammarCache, grammar_text, llguidance_module
from jaxinfer.engine.structured.masks import StructuredOutputs
from jaxinfer.engine.structured.request_grammar import RequestGrammar

__all__ = ["EXTRA_HINT", "GrammarCache", "RequestGrammar", "StructuredOutputs", "grammar_text", "llguidance_module"]
