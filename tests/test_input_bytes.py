"""What an engine step sends to the device: O(rows), whatever the context, the vocabulary or the
sampling options. Logit bias and penalty counts stay in the rows' sampling slots on the device, a
free step's structured-output mask is a device-resident constant, and a verify step ships a fixed
window of each row's tokens, not its history."""

from __future__ import annotations

import numpy as np
import pytest
from engine_knobs import ENGINE, WIDE

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.config.sampling_params import MAX_LOGIT_BIAS
from jaxinfer.runtime.model_runner import FIXED_ARGS
from jaxinfer.runtime.packed_tree import PackedTree
from jaxinfer.runtime.page_table_diffs import PageTables

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
    return LLM(checkpoint_dir("llama3"), **ENGINE)


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


def test_a_decode_step_sends_the_same_bytes_whatever_max_seq_len(llm, checkpoint_dir):
    """Page tables stay on the device: a longer max_seq_len (wider tables) sends nothing more a step."""
    wide = LLM(checkpoint_dir("llama3"), **WIDE)
    narrow_sent, wide_sent = (sent_per_shape(m, [SHORT], GREEDY) for m in (llm, wide))
    assert narrow_sent[("decode", 1, 1)] == wide_sent[("decode", 1, 1)]


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
    llm = LLM(checkpoint_dir("llama3"), speculative=spec, **WIDE)
    short, long = (sent_per_shape(llm, [p], GREEDY) for p in (SHORT * 2, LONG))
    verify = [shape for shape in short if shape[0] == "verify" and shape in long]
    assert verify and all(short[shape] == long[shape] for shape in verify), (short, long)
    for shape in verify:  # less than the rows' whole histories would take alone
        assert max(short[shape]) < shape[2] * WIDE["max_seq_len"] * 4


def test_page_tables_ship_what_the_rows_gained():
    tables = PageTables(num_slots=4, width=8)
    pages_a, pages_b = [5, 6], [9]
    entries = tables.changes(np.array([1, 2, 0]), [pages_a, pages_b, None], capacity=6)
    assert entries[:3].tolist() == [[1, 0, 5], [1, 1, 6], [2, 0, 9]] and (entries[3:, 0] == 4).all()
    pages_a.append(7)  # a decode call crossed into a new page
    assert tables.changes(np.array([1, 2]), [pages_a, pages_b], capacity=4)[:1].tolist() == [[1, 2, 7]]
    readmitted = [11, 12, 13]  # a new list: the slot's table is rewritten from column 0
    assert tables.changes(np.array([1]), [readmitted], capacity=2) is None
    assert tables.table[1, :3].tolist() == readmitted and tables.table[2, 0] == 9


def test_a_prefix_hit_past_the_step_entries_sends_the_tables_whole_and_stays_exact(checkpoint_dir):
    """A cached prefix brings more pages than a step ships entries for: the host's tables go whole."""
    llm = LLM(checkpoint_dir("llama3"), **WIDE)
    prompt = (SHORT * 40)[:148]  # 9 full pages cached by the first run
    first = llm.generate([prompt], GREEDY)[0].token_ids
    runner, whole = llm.engine.runner, []
    dispatch = runner.dispatch

    def spy(host, *args, **kwargs):
        out = dispatch(host, *args, **kwargs)
        whole.append(runner.table_bytes)
        return out

    runner.dispatch = spy
    again = llm.generate([prompt], GREEDY)[0].token_ids
    del runner.dispatch
    assert llm.engine.metrics()["prefix_cache_hits"] > 0 and any(whole), whole
    assert again == first


def test_every_step_program_takes_its_inputs_in_one_buffer(checkpoint_dir):
    """A verify call's drafts, rounds and catch-up window and a decode call's step count travel in
    the step's one packed buffer (one host-to-device transfer): each step program's arguments after
    the weights, pools and row state are that buffer and the structured-output bitmask."""
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, adaptive=False)
    llm = LLM(checkpoint_dir("llama3"), speculative=spec, **ENGINE)
    kinds = set()
    for host in llm.engine.step_hosts():
        inputs, _bitmask = llm.engine.runner.program_for(host).args[FIXED_ARGS:]
        assert isinstance(inputs, PackedTree), host.shape
        kinds.add(host.shape[0])
    assert kinds == {"ragged", "decode", "verify"}
