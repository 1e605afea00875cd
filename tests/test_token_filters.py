"""vLLM's allowed_token_ids, bad_words and truncate_prompt_tokens: the packed masks against a plain reading of
the rules, and the engine's tokens against the model's own choices under them (plain steps, verify steps with
drafts, alongside unfiltered rows). (test_server sends them through the OpenAI API.)"""

from __future__ import annotations

import numpy as np
import pytest
from engine_knobs import ENGINE

from jaxinfer import LLM, SamplingParams
from jaxinfer.engine.structured.token_filter import TokenFilter, bad_word_ids, packed_row

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"


def allowed(row: np.ndarray, vocab: int) -> set[int]:
    return {t for t in range(vocab) if (int(row.view(np.uint32)[t // 32]) >> (t % 32)) & 1}


def greedy(max_tokens: int = 12, **fields) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **fields)


def test_masks_follow_the_rules():
    assert allowed(packed_row(70, [0, 31, 32, 63, 69]), 70) == {0, 31, 32, 63, 69}  # bits 31 and 63: the signs
    words = [(5,), (1, 31), (7, 8, 63)]
    rule = TokenFilter(70, None, words)
    assert allowed(rule.row(), 70) == set(range(70)) - {5}  # a one-token word: banned everywhere
    rule.accept(1)
    assert allowed(rule.row(), 70) == set(range(70)) - {5, 31}  # the output ends with 1: 31 would complete (1, 31)
    assert allowed(rule.row([7, 8]), 70) == set(range(70)) - {5, 63}  # drafts count as output
    rule.accept(2)
    assert allowed(rule.row(), 70) == set(range(70)) - {5}
    only = TokenFilter(70, [3, 5, 31], words)
    assert allowed(only.row(), 70) == {3, 31}
    assert TokenFilter(70, [3, 5], [(5,)]).static and not only.static  # one mask for every position, or not


def test_bad_words_are_tokenized_as_written_and_after_a_space(text_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(text_model_dir)
    ids = bad_word_ids(tok, ["return", " add"])
    assert tuple(tok.encode("return", add_special_tokens=False)) in ids
    assert tuple(tok.encode("add", add_special_tokens=False)) in ids  # stripped on the left first
    spaced = tuple(tok.encode(" add", add_special_tokens=False))
    plain = tuple(tok.encode("add", add_special_tokens=False))
    assert (spaced in ids) == (len(spaced) == len(plain) and spaced[0] != plain[0])


@pytest.fixture(scope="module")
def llm(text_model_dir) -> LLM:
    return LLM(text_model_dir, **ENGINE)


def test_allowed_token_ids_pick_the_models_best_of_them(llm):
    ids = llm.tokenize(PROMPT)
    logits = llm.logits(ids)[-1]
    choice = [7, 19, 40, 41, 200, 299]
    first = choice[int(np.argmax(logits[choice]))]
    outs = llm.generate([ids, ids], [greedy(allowed_token_ids=choice), greedy()])
    filtered, plain = (o.outputs[0].token_ids for o in outs)
    assert filtered[0] == first and set(filtered) <= set(choice)
    assert plain[0] == int(np.argmax(logits)) and not set(plain) <= set(choice)  # the row beside it is free
    sampled = llm.generate(ids, SamplingParams(max_tokens=16, temperature=1.5, seed=3, allowed_token_ids=choice))
    assert set(sampled[0].outputs[0].token_ids) <= set(choice)


def device_calls(llm: LLM, params: SamplingParams) -> tuple[list[int], int]:
    """The greedy tokens of PROMPT under params, and the engine's device calls for them."""
    before = llm.metrics()["engine_steps"]
    tokens = llm.generate(PROMPT, params)[0].outputs[0].token_ids
    return tokens, llm.metrics()["engine_steps"] - before


def test_a_fixed_mask_decodes_several_steps_a_call_and_a_changing_one_one(llm):
    """allowed_token_ids hold one mask for every step: a call runs decode_steps (4) of them; a bad word of
    two tokens changes the mask with each token: one step a call. The tokens are those one-step calls give
    (chained calls, started before the call ahead lands, carry the mask too)."""
    choice = word_tokens(llm)
    steady, steady_calls = device_calls(llm, greedy(16, allowed_token_ids=choice))
    word, banned, _ = _written_word(llm, steady)
    stepped, stepped_calls = device_calls(llm, greedy(16, allowed_token_ids=choice, bad_words=[word]))
    assert any(len(w) > 1 for w in banned) and steady_calls <= 7 and stepped_calls >= 15  # 16 tokens: 4 or 15 calls
    one_step = LLM(llm.model_dir, **{**ENGINE, "decode_steps": 1, "async_scheduling": False})  # a mask per token
    assert one_step.generate(PROMPT, greedy(16, allowed_token_ids=choice))[0].outputs[0].token_ids == steady


def _contains(tokens: list[int], word: tuple[int, ...]) -> bool:
    return any(tuple(tokens[i : i + len(word)]) == word for i in range(len(tokens) - len(word) + 1))


def word_tokens(llm: LLM) -> list[int]:
    """The vocabulary's ids that read as whole words (the tiny random model otherwise writes bytes)."""
    tokenizer = llm.get_tokenizer()
    return [t for t in range(len(tokenizer)) if len(tokenizer.decode([t]).strip()) > 1
            and tokenizer.decode([t]).strip().isalpha()]


def _written_word(llm: LLM, tokens: list[int]) -> tuple[str, list[tuple[int, ...]], int]:
    """A word of one or two tokens that greedy decoding wrote and that reads back as those tokens (two
    preferred: a leading part to match), its spellings, and the position of its last token."""
    tokenizer = llm.get_tokenizer()
    for n in (2, 1):
        for i in range(len(tokens) - n + 1):
            word = tokenizer.decode(tokens[i : i + n])
            spellings = bad_word_ids(tokenizer, [word])
            if tuple(tokens[i : i + n]) in spellings:
                return word, spellings, i + n - 1
    raise AssertionError(f"no word of {tokens} reads back as its tokens")


def test_bad_words_are_never_completed_and_nothing_else_changes(llm):
    words = word_tokens(llm)
    plain = llm.generate(PROMPT, greedy(16, allowed_token_ids=words))[0].outputs[0]
    word, banned, hit = _written_word(llm, plain.token_ids)
    out = llm.generate(PROMPT, greedy(16, allowed_token_ids=words, bad_words=[word]))[0].outputs[0]
    assert not any(_contains(out.token_ids, w) for w in banned)
    assert out.token_ids[:hit] == plain.token_ids[:hit] and out.token_ids[hit] != plain.token_ids[hit]


def test_verify_steps_mask_every_drafted_position(text_model_dir, llm):
    """Prompt lookup drafts the repeated function; each drafted position gets the filter's mask, so the
    speculating engine's tokens equal the plain engine's under the same bad words."""
    spec = LLM(text_model_dir, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                    "adaptive": False}, **ENGINE)
    words = word_tokens(llm)
    word, _, _ = _written_word(llm, llm.generate(PROMPT, greedy(16, allowed_token_ids=words))[0].outputs[0].token_ids)
    params = greedy(16, bad_words=[word], allowed_token_ids=words)
    speculated = spec.generate(PROMPT, params)[0]
    assert speculated.spec_stats["drafted"] > 0  # verify steps ran, with drafts to mask
    assert speculated.outputs[0].token_ids == llm.generate(PROMPT, params)[0].outputs[0].token_ids


def test_truncate_prompt_tokens_keeps_the_last_ones(llm):
    ids = llm.tokenize(PROMPT)
    kept = llm.generate(ids, greedy(8, truncate_prompt_tokens=6))[0]
    assert kept.outputs[0].token_ids == llm.generate(ids[-6:], greedy(8))[0].outputs[0].token_ids
    long = ids * 20  # past the context: -1 keeps what fits beside max_tokens
    assert len(llm.generate(long, greedy(8, truncate_prompt_tokens=-1))[0].outputs[0].token_ids) == 8


@pytest.mark.parametrize("fields, error, message", [
    (dict(allowed_token_ids=[]), ValueError, "allowed_token_ids is empty"),
    (dict(allowed_token_ids=[3, "a"]), TypeError, "allowed_token_ids[1]"),
    (dict(bad_words="word"), TypeError, "bad_words must be a list of non-empty strings, got 'word'"),
    (dict(bad_words=[" "]), TypeError, "bad_words must be a list of non-empty strings"),
    (dict(truncate_prompt_tokens=0), ValueError, "truncate_prompt_tokens must be >= 1"),
])
def test_bad_values_name_the_field(fields, error, message):
    with pytest.raises(error, match=message.replace("[", r"\[")):
        SamplingParams(**fields)


def test_ids_outside_the_vocabulary_are_refused_naming_them(llm):
    with pytest.raises(ValueError, match=r"allowed_token_ids has ids \[320\] outside the vocabulary \[0, 320\)"):
        llm.generate("x", greedy(2, allowed_token_ids=[3, 320]))
    assert llm.generate("x", greedy(2))[0].outputs[0].token_ids  # the LLM goes on
