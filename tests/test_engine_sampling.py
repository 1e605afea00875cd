"""The engine's per-request sampling set: stop strings, min_tokens, penalties, logit bias, logprobs, n."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from engine_knobs import ENGINE

from jaxinfer import LLM, SamplingParams
from jaxinfer.checkpoint.tokenizer import decode_text
from jaxinfer.engine import AsyncLLMEngine

PROMPT = np.random.RandomState(3).randint(3, 250, size=11).tolist()
@pytest.fixture(scope="module")
def llm(checkpoint_dir):
    return LLM(checkpoint_dir("llama3"), **ENGINE)


@pytest.fixture(scope="module")
def text_llm(text_model_dir):
    return LLM(text_model_dir, **ENGINE)


def greedy(n: int = 24, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, **kw)


def test_stop_string_ends_output_and_is_cut(text_llm):
    full = text_llm.generate("hello world", greedy(24))[0]
    assert len(full.text) > 6
    stop = full.text[3:6]  # may span a token boundary
    out = text_llm.generate("hello world", greedy(24, stop=[stop]))[0]
    assert out.text == full.text[: full.text.index(stop)]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == stop


def test_streamed_pieces_never_show_the_stop_string(text_llm):
    full = text_llm.generate("hello world", greedy(24))[0].text
    stop = full[5:8]
    pieces = list(text_llm.stream_text("hello world", greedy(24, stop=[stop])))
    assert "".join(pieces) == full[: full.index(stop)]


def test_text_decoded_once_per_call_equals_the_ids_decoded_whole(text_llm):
    # Without stop strings a multi-step call detokenizes its tokens together, not one by one.
    prompts = ["hello world", "def f(x):", "a"]
    outs = text_llm.generate(prompts, greedy(30))
    for prompt, out in zip(prompts, outs):
        assert out.text == decode_text(text_llm.tokenizer, out.token_ids)
        assert "".join(text_llm.stream_text(prompt, greedy(30))) == out.text


def test_stop_string_kept_when_asked_whole_and_streamed(text_llm):
    full = text_llm.generate("hello world", greedy(24))[0].text
    stop = full[4:7]
    kept = full[: full.index(stop) + len(stop)]
    params = greedy(24, stop=[stop], include_stop_str_in_output=True)
    out = text_llm.generate("hello world", params)[0]
    assert out.text == kept and out.outputs[0].stop_reason == stop
    assert "".join(text_llm.stream_text("hello world", params)) == kept


def test_min_tokens_masks_stop_ids(llm):
    first = llm.generate([PROMPT], greedy(8))[0].token_ids
    stop = first[2]
    stopped = llm.generate([PROMPT], greedy(8, stop_token_ids=[stop]))[0]
    assert stopped.token_ids[-1] == stop and stopped.finish_reason == "stop"
    held = llm.generate([PROMPT], greedy(8, stop_token_ids=[stop], min_tokens=6))[0]
    assert stop not in held.token_ids[:6] and len(held.token_ids) >= 6


def penalized_reference(llm: LLM, prompt: list[int], n: int, rep: float, presence: float, frequency: float) -> list[int]:
    """Greedy tokens with vLLM's penalties, each from the full recompute's logits and the host's own counts."""
    out: list[int] = []
    for _ in range(n):
        logits = llm.logits(prompt + out)[-1].astype(np.float64)
        counts = np.bincount(out, minlength=len(logits))
        seen = counts > 0
        seen[prompt] = True
        logits = np.where(seen, np.where(logits > 0, logits / rep, logits * rep), logits)
        out.append(int(np.argmax(logits - frequency * counts - presence * (counts > 0))))
    return out


def test_penalty_counts_kept_on_the_device_are_exact_under_preemption(llm):
    """Penalized and plain requests together on a pool too small for them (preemptions, recompute) and
    multi-step calls: every penalized one equals the host-side formula at every token."""
    settings = [(1.8, 0.0, 0.0), (1.0, 0.7, 0.4), (1.3, 0.2, 0.9)]
    prompts = [np.random.RandomState(i).randint(3, 250, size=n).tolist() for i, n in enumerate([11, 30, 5])]
    params = [greedy(60, repetition_penalty=r, presence_penalty=p, frequency_penalty=f) for r, p, f in settings]
    before = llm.metrics()["num_preemptions"]
    outputs = llm.generate(prompts + [PROMPT], params + [greedy(50)])
    assert llm.metrics()["num_preemptions"] > before
    for prompt, (r, p, f), out in zip(prompts, settings, outputs):
        assert out.outputs[0].token_ids == penalized_reference(llm, prompt, 60, r, p, f)


def test_penalties_match_the_formula_on_logits(llm):
    """The first penalized choice equals argmax of the HF/vLLM-penalized logits of the prompt."""
    params = greedy(2, repetition_penalty=1.8, presence_penalty=0.7, frequency_penalty=0.4)
    out = llm.generate([PROMPT], params)[0].token_ids
    logits = llm.logits(PROMPT)[-1].astype(np.float64)
    seen = np.zeros_like(logits, bool)
    seen[PROMPT] = True
    first = np.where(seen, np.where(logits > 0, logits / 1.8, logits * 1.8), logits)
    assert out[0] == int(np.argmax(first))
    second = llm.logits(PROMPT + out[:1])[-1].astype(np.float64)
    seen[out[0]] = True
    second = np.where(seen, np.where(second > 0, second / 1.8, second * 1.8), second)
    second[out[0]] -= 0.7 + 0.4
    assert out[1] == int(np.argmax(second))


def test_logit_bias_is_added_to_the_logits_of_every_step(llm):
    """Each greedy pick (a ragged step, then multi-step decode calls) is argmax(logits + bias); the
    unbiased row beside it keeps its own tokens."""
    plain = llm.generate([PROMPT], greedy(6))[0].token_ids
    bias = {plain[0]: -100.0, plain[2]: -3.5, 40: 2.5}
    biased, unbiased = llm.generate([PROMPT, PROMPT], [greedy(6, logit_bias=bias), greedy(6)])
    expected: list[int] = []
    for _ in range(6):
        row = llm.logits(PROMPT + expected)[-1].astype(np.float64)
        row[list(bias)] += list(bias.values())
        expected.append(int(np.argmax(row)))
    assert biased.token_ids == expected != plain
    assert unbiased.token_ids == plain


def test_logprobs_are_the_models_distribution(llm):
    out = llm.generate([PROMPT], greedy(3, logprobs=5, prompt_logprobs=2))[0]
    ids = out.token_ids
    assert len(out.outputs[0].logprobs) == 3
    for i, entry in enumerate(out.outputs[0].logprobs):
        row = llm.logits(PROMPT + ids[:i])[-1].astype(np.float64)
        logp = row - np.log(np.exp(row - row.max()).sum()) - row.max()
        top = np.argsort(-logp)[:5]
        assert set(entry) >= set(top.tolist()) and ids[i] in entry
        for token, value in entry.items():
            assert value.logprob == pytest.approx(logp[token], abs=1e-4)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(PROMPT)
    assert PROMPT[1] in out.prompt_logprobs[1]


def test_n_samples_share_the_prompt_and_follow_their_seeds(llm):
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=11, n=3, ignore_eos=True)
    out = llm.generate([PROMPT], params)[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    for i, sample in enumerate(out.outputs):
        alone = SamplingParams(max_tokens=10, temperature=1.0, seed=11 + i, ignore_eos=True)
        assert sample.token_ids == llm.generate([PROMPT], alone)[0].token_ids
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1


def test_async_engine_batches_concurrent_requests_and_aborts_on_disconnect(llm):
    engine = AsyncLLMEngine(llm.engine)
    prompts = [np.random.RandomState(50 + i).randint(3, 250, size=4 + i).tolist() for i in range(6)]
    expected = [o.token_ids for o in llm.generate(prompts, greedy(10))]
    free = llm.engine.blocks.usable_pages

    async def collect(prompt):
        ids = []
        async for delta in engine.generate(prompt, greedy(10)):
            ids += delta.token_ids
        return ids

    async def disconnect():
        async for _ in engine.generate(PROMPT, greedy(60)):
            break  # the client goes away after the first delta

    async def main():
        return await asyncio.gather(*(collect(p) for p in prompts), disconnect())

    results = asyncio.run(main())
    assert results[:-1] == expected
    assert not llm.engine.has_unfinished() or llm.engine.step() is not None
    assert llm.engine.blocks.usable_pages == free


def test_host_seed_keys_are_the_keys_jax_builds():
    """The step's keys, made on the host in one pass: seed_key of each seed (the high word too, which
    jax.random.PRNGKey drops without x64), PRNGKey's own below 2**32."""
    import jax

    from jaxinfer.sampling.sampler import seed_key, seed_keys

    small, large = [0, 1, 7, 2**32 - 1], [2**32 + 5, 2**63 - 1, 123456789012345, -1523329929, -(2**63)]
    np.testing.assert_array_equal(seed_keys(small + large), np.stack([seed_key(s) for s in small + large]))
    jax_keys = np.stack([np.asarray(jax.random.key_data(jax.random.PRNGKey(s))) for s in small])
    np.testing.assert_array_equal(seed_keys(small), jax_keys)
