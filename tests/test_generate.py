"""Generation behaviour: batching, seeds, stop conditions, streaming."""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams

PROMPTS = [
    np.random.RandomState(i).randint(3, 256, size=n).tolist() for i, n in enumerate([5, 17, 9, 30, 1])
]


@pytest.fixture(scope="module")
def llm(checkpoint_dir):
    return LLM(checkpoint_dir("llama3"), dtype="float32", max_seq_len=128)


def test_batched_greedy_equals_each_prompt_alone(llm):
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    batched = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, batched):
        assert llm.generate([prompt], params)[0].token_ids == out.token_ids


def test_same_seed_same_output_different_seed_different(llm):
    def sample(seed: int) -> list[int]:
        params = SamplingParams(max_tokens=24, temperature=1.0, top_k=50, top_p=0.95, seed=seed, ignore_eos=True)
        return llm.generate([PROMPTS[1]], params)[0].token_ids

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_seeded_sample_does_not_depend_on_batch(llm):
    params = SamplingParams(max_tokens=16, temperature=0.8, min_p=0.05, seed=3, ignore_eos=True)
    alone = llm.generate([PROMPTS[0]], params)[0].token_ids
    together = llm.generate(PROMPTS, params)[0].token_ids
    assert alone == together


def test_stop_token_ends_sequence_with_reason_stop(llm):
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    free = llm.generate([PROMPTS[2]], params)[0].token_ids
    stop_at = free[5]
    first = free.index(stop_at)
    out = llm.generate([PROMPTS[2]], SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[stop_at]))[0]
    assert out.token_ids == free[: first + 1]
    assert out.finish_reason == "stop"


def test_max_tokens_per_request(llm):
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (1, 7, 3)]
    outs = llm.generate(PROMPTS[:3], params)
    assert [len(o.token_ids) for o in outs] == [1, 7, 3]
    assert all(o.finish_reason == "length" for o in outs)


def test_greedy_rows_unaffected_by_sampled_neighbours(llm):
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    alone = llm.generate([PROMPTS[3]], greedy)[0].token_ids
    mixed = llm.generate(
        [PROMPTS[3], PROMPTS[4]], [greedy, SamplingParams(max_tokens=12, temperature=1.5, seed=1)]
    )
    assert mixed[0].token_ids == alone


def test_stream_pieces_join_to_generate_text(text_model_dir):
    llm = LLM(text_model_dir, dtype="float32", max_seq_len=128)
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    full = llm.generate("def add(a, b):", params)[0]
    pieces = list(llm.stream_text("def add(a, b):", params))
    assert len(pieces) > 1
    assert "".join(pieces) == full.text
    assert full.text == llm.tokenizer.decode(full.token_ids, skip_special_tokens=True)


def test_text_prompts_and_token_prompts_agree(text_model_dir):
    llm = LLM(text_model_dir, dtype="float32", max_seq_len=128)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    by_text = llm.generate(["for i in range"], params)[0]
    by_ids = llm.generate([by_text.prompt_token_ids], params)[0]
    assert by_text.token_ids == by_ids.token_ids


def test_interrupted_generate_leaves_no_requests_behind(llm, monkeypatch):
    """A KeyboardInterrupt (Ctrl-C in a notebook) mid-generate aborts its requests: the next call
    does not run them to the end first, and gives what it gives alone."""
    params = SamplingParams(max_tokens=4, temperature=0)
    alone = llm.generate([[9, 8, 7]], params)[0].outputs[0].token_ids
    step, calls = llm.engine.step, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    monkeypatch.setattr(llm.engine, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[1, 2, 3]] * 3, SamplingParams(max_tokens=60, ignore_eos=True))
    assert not llm.engine.has_unfinished()
    assert llm.generate([[9, 8, 7]], params)[0].outputs[0].token_ids == alone
