"""What an engine step sends to the device: O(rows), whatever the context, the vocabulary or the
sampling options. Logit bias and penalty counts stay in the rows' sampling slots on the device, a
free step's structured-output mask is a device-resident constant, and a verify step ships a fixed
window of each row's tokens, not its history."""

from __future__ import annotations

import pytest

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.config.sampling_params import MAX_LOGIT_BIAS

KNOBS = dict(dtype="float32", max_seq_len=96, max_num_seqs=4, max_num_batched_tokens=32, decode_steps=4, num_pages=40)
SHORT = [21, 22, 23, 24, 25, 26]
LONG = SHORT * 10  # 60 tokens
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def sent_per_shape(llm: LLM, prompts: list[list[int]], params: SamplingParams | list) -> dict[tuple, set[int]]:
    """{step shape: the input bytes each call of it sent} over one generate call."""
    runner, sent = llm.engine.runner, {}
    dispatch = runner.dispatch

    def spy(host, *args, **kwargs):
        out = dispatch(host, *args, **kwargs)
        sent.setdefault(host.shape, set()).add(runner.input_bytes)
        return out

    runner.dispatch = spy
    try:
        llm.generate(prompts, params)
    finally:
        del runner.dispatch
    return sent


@pytest.fixture(scope="module")
def llm(checkpoint_dir):
    return LLM(checkpoint_dir("llama3"), **KNOBS)


def test_a_steps_inputs_do_not_grow_with_logit_bias_or_context(llm):
    biased = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                            logit_bias={i: 0.5 for i in range(40, 240)})
    plain = sent_per_shape(llm, [SHORT], GREEDY)
    for prompts, params in [([SHORT], biased), ([LONG], GREEDY), ([LONG], biased)]:
        other = sent_per_shape(llm, prompts, params)
        decode = [shape for shape in other if shape[0] == "decode"]
        assert decode and all(other[shape] == plain[shape] for shape in decode), (other, plain)
    (rows_1,) = plain[("decode", 1, 1)]
    vocab = llm.engine.model_config.vocab_size
    assert rows_1 < 4 * (vocab // 32 + MAX_LOGIT_BIAS)  # neither a mask nor a bias row goes with it


def test_slots_are_reused_with_the_new_requests_bias(llm):
    """A slot a biased request gave back holds the next request's bias, not the old one's."""
    free = llm.generate([SHORT], GREEDY)[0].token_ids
    first = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logit_bias={free[0]: -100})
    second = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logit_bias={free[1]: -100})
    alone = [llm.generate([SHORT], p)[0].token_ids for p in (first, second)]
    assert free[0] not in alone[0] and free[1] not in alone[1]
    together = [o.token_ids for o in llm.generate([SHORT, SHORT, SHORT], [first, GREEDY, second])]
    assert together == [alone[0], free[:12], alone[1]]


def test_a_verify_step_ships_a_window_not_the_history(checkpoint_dir):
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, adaptive=False)
    llm = LLM(checkpoint_dir("llama3"), speculative=spec, **{**KNOBS, "max_seq_len": 512})
    short, long = (sent_per_shape(llm, [p], GREEDY) for p in (SHORT * 2, LONG))
    verify = [shape for shape in short if shape[0] == "verify" and shape in long]
    assert verify and all(short[shape] == long[shape] for shape in verify), (short, long)
    for shape in verify:  # less than the rows' whole histories would take alone
        assert max(short[shape]) < shape[2] * 512 * 4
