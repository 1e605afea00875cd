"""`sampling.token_bitmask`: the packed structured-output mask applied on the device, against NumPy."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.sampling.token_bitmask import all_allowed, apply_token_bitmask, bitmask_width


def reference(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """Bit j of word i (little-endian bit order within each int32 word) allows token 32 * i + j."""
    bits = np.unpackbits(bitmask.astype("<i4").view(np.uint8), axis=1, bitorder="little")
    return np.where(bits[:, : logits.shape[1]].astype(bool), logits, -np.inf)


@pytest.mark.parametrize("vocab", [64, 100, 4096])
def test_matches_numpy_reference(vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.normal(size=(5, vocab)).astype(np.float32)
    bitmask = rng.integers(-(2**31), 2**31, size=(5, bitmask_width(vocab)), dtype=np.int64).astype(np.int32)
    bitmask[1] = -1  # a free row
    bitmask[2, :] = 0
    bitmask[2, 0] = np.int32(-(2**31))  # only token 31: the sign bit
    out = np.asarray(apply_token_bitmask(jnp.asarray(logits), jnp.asarray(bitmask)))
    np.testing.assert_array_equal(out, reference(logits, bitmask))
    np.testing.assert_array_equal(out[1], logits[1])
    assert np.flatnonzero(np.isfinite(out[2])).tolist() == [31]


def test_all_ones_rows_change_nothing():
    logits = np.linspace(-3, 3, 3 * 70, dtype=np.float32).reshape(3, 70)
    out = apply_token_bitmask(jnp.asarray(logits), jnp.asarray(all_allowed(3, 70)))
    np.testing.assert_array_equal(np.asarray(out), logits)


def test_bf16_logits_keep_their_dtype():
    logits = jnp.ones((2, 40), jnp.bfloat16)
    mask = np.zeros((2, bitmask_width(40)), np.int32)
    mask[:, 0] = 0b101
    out = apply_token_bitmask(logits, jnp.asarray(mask))
    assert out.dtype == jnp.bfloat16
    assert np.flatnonzero(np.isfinite(np.asarray(out[0], np.float32))).tolist() == [0, 2]


def test_llguidance_fills_the_same_layout():
    """The host library's masks read the same way: a choice grammar allows exactly its first tokens."""
    pytest.importorskip("llguidance")
    import llguidance
    import llguidance.hf
    import llguidance.numpy

    from jaxinfer.checkpoint.tokenizer import load_tokenizer
    from jaxinfer.entrypoints.llm import DEMO_MODEL

    tokenizer = load_tokenizer(DEMO_MODEL)
    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tokenizer), llguidance.grammar_from("regex", "[ab]"))
    mask = llguidance.numpy.allocate_token_bitmask(1, len(tokenizer))
    llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
    out = np.asarray(apply_token_bitmask(jnp.zeros((1, len(tokenizer))), jnp.asarray(mask)))
    allowed = sorted(tokenizer.decode([t]) for t in np.flatnonzero(np.isfinite(out[0])))
    assert allowed == ["a", "b"]
