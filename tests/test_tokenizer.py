"""Incremental detokenization: streamed pieces join to the full text, at a cost per new token."""

from __future__ import annotations

import random

import pytest
import transformers

from jaxinfer.checkpoint.tokenizer import Detokenizer, decode_text
from jaxinfer.entrypoints.llm import DEMO_MODEL

# Spaces before punctuation: what clean-up of tokenization spaces rewrites; then multi-byte characters.
TEXT = "x = foo(a , b) ; print(y) ! don 't stop . héllo wörld — ✓ 日本語 ok"


@pytest.fixture(scope="module")
def cleanup_tokenizer():
    """The demo tokenizer with clean-up of tokenization spaces forced on (Llama-3 configs under 4.x)."""
    tok = transformers.AutoTokenizer.from_pretrained(DEMO_MODEL)
    tok.clean_up_tokenization_spaces = True
    tok.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    assert tok.decode(tok.encode(TEXT)) != TEXT, "clean-up is not active; the test would prove nothing"
    return tok


def stream(tokenizer, ids: list[int], chunk: int) -> list[str]:
    """Pieces from pushing the growing id list `chunk` tokens at a time, then flushing."""
    detok = Detokenizer(tokenizer)
    pieces = [detok.push(ids[:end]) for end in range(chunk, len(ids) + chunk, chunk)]
    return pieces + [detok.flush()]


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_stream_joins_to_full_text_with_cleanup_on(cleanup_tokenizer, chunk):
    ids = cleanup_tokenizer.encode(TEXT)
    pieces = stream(cleanup_tokenizer, ids, chunk)
    assert "".join(pieces) == decode_text(cleanup_tokenizer, ids) == TEXT
    assert sum(bool(p) for p in pieces) > len(ids) // (2 * chunk), "text was held back instead of streamed"


def test_irregular_pushes_of_random_ids_give_the_same_text(cleanup_tokenizer):
    # The engine pushes a multi-step call's tokens together; any ids (special tokens, parts of
    # characters) must then read as they do pushed one by one.
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(len(cleanup_tokenizer)) for _ in range(rng.randint(1, 24))]
        one_by_one = "".join(stream(cleanup_tokenizer, ids, 1))
        detok, text, end = Detokenizer(cleanup_tokenizer), "", 0
        while end < len(ids):
            end = min(len(ids), end + rng.randint(1, 9))
            text += detok.push(ids[:end])
        assert text + detok.flush() == one_by_one


def test_no_piece_ends_inside_a_character(cleanup_tokenizer):
    ids = cleanup_tokenizer.encode("✓✓ 日本語")
    pieces = stream(cleanup_tokenizer, ids, 1)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == "✓✓ 日本語"


def test_flush_returns_a_trailing_partial_character(cleanup_tokenizer):
    ids = cleanup_tokenizer.encode("ok ✓")
    detok = Detokenizer(cleanup_tokenizer)
    partial = ids[:-1]  # the last byte of ✓ is missing
    assert detok.push(partial) + detok.flush() == decode_text(cleanup_tokenizer, partial)
    assert detok.push(partial) + detok.flush() == ""  # flushed ids are emitted: pushed again, nothing


class CountingTokenizer:
    """Delegates decode, recording the longest id list any call saw."""

    def __init__(self, tokenizer):
        self.tokenizer, self.longest = tokenizer, 0

    def decode(self, ids, **kwargs) -> str:
        self.longest = max(self.longest, len(ids))
        return self.tokenizer.decode(ids, **kwargs)


def test_each_push_decodes_only_recent_tokens(cleanup_tokenizer):
    ids = cleanup_tokenizer.encode(TEXT * 8)
    counting = CountingTokenizer(cleanup_tokenizer)
    pieces = stream(counting, ids, 4)
    assert "".join(pieces) == TEXT * 8
    assert len(ids) > 300 and counting.longest <= 32  # a few chunks, not the sequence
