"""Verify calls chained behind the call in flight (async scheduling with a draft model, an EAGLE head or
the device's lookup): the device lays their rows out from the decode carry the call ahead left (`runtime/verify_carry`),
so the host plans them before that call lands. Outputs are plain decoding's, rows that end inside the
call ahead (max_tokens, a stop id) end there, and a self-draft still accepts every draft (its pool saw
every position through chained calls, which catch nothing up). Sampled rows, whose draws are keyed by
seed and position, give the tokens unchained calls give: the statistical test of the acceptance rule
(test_speculative_sampling) then holds for chained calls too."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from eagle_models import tiny_target_and_heads
from engine_knobs import SPECULATION
from engine_runs import summary
from hf_models import save_hf_model

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.runtime.engine_step import RowSampling, StepInputs, StepOutputs
from jaxinfer.runtime.row_state import RowState
from jaxinfer.runtime.verify_carry import carried_verify_rows, with_verify_carry
from jaxinfer.runtime.verify_step import Drafts

LOOP = [21, 22, 23, 24, 25, 26] * 3
PROMPTS = [LOOP, LOOP[2:] + [40], np.random.RandomState(3).randint(3, 250, size=11).tolist(), LOOP[:7]]


def _state(last_tokens, lengths, done) -> RowState:
    return RowState(None, None, jnp.asarray(last_tokens, jnp.int32), jnp.asarray(lengths, jnp.int32),
                    jnp.asarray(done, bool))


def _inputs(tokens, positions, lengths, query_lens, slots, carried, max_lengths, stop_ids) -> StepInputs:
    sampling = RowSampling(None, jnp.asarray(stop_ids, jnp.int32), None, jnp.asarray(max_lengths, jnp.int32),
                           None, None, None, None, None, None)
    i32 = lambda a: jnp.asarray(a, jnp.int32)  # noqa: E731
    return StepInputs(i32(tokens), i32(positions), None, i32(slots), None, None, None, None, i32(lengths),
                      i32(query_lens), None, None, sampling, jnp.asarray(carried, bool))


def test_carried_rows_are_laid_out_from_the_carry():
    """Slot 1 goes on (3 drafts), slot 2 finished in the call ahead (padding), slot 3 is 2 tokens from
    max_tokens (1 draft); row 3 was laid out by the host and stays as it is."""
    state = _state([0, 7, 8, 9], [0, 10, 15, 20], [False, False, True, False])
    host_row = ([5, 31, 32, 0], [30, 31, 32, -1])
    x = _inputs([0] * 12 + host_row[0], [0] * 12 + host_row[1], [1, 1, 1, 33], [0, 0, 0, 3], [1, 2, 3, 4],
                [True, True, True, False], [100, 100, 22, 100], np.full((4, 2), -1))
    drafts = Drafts(jnp.asarray([[0] * 3, [0] * 3, [0] * 3, [31, 32, 0]], jnp.int32), jnp.asarray([3, 3, 3, 2]))
    x, drafts, draft_start = carried_verify_rows(state, x, drafts, jnp.asarray([0, 0, 0, 12], jnp.int32))
    assert x.tokens.tolist() == [7, 0, 0, 0, 8, 0, 0, 0, 9, 0, 0, 0, *host_row[0]]  # padding keeps its token
    assert x.positions.tolist() == [9, 10, 11, 12, -1, -1, -1, -1, 19, 20, -1, -1, *host_row[1]]
    assert x.lengths.tolist() == [13, 15, 21, 33] and x.query_lens.tolist() == [4, 0, 2, 3]
    assert drafts.count.tolist() == [3, 0, 1, 2] and drafts.tokens[3].tolist() == [31, 32, 0]
    assert draft_start.tolist() == [9, 14, 19, 12]  # nothing to catch up where carried


def test_a_verify_call_leaves_each_rows_carry():
    """Row 0 emits 2 tokens and goes on, row 1 emits its stop id, row 2 reaches max_tokens, row 3 is padding."""
    state = _state([0, 1, 2, 3], [0, 50, 60, 70], [False, False, False, True])
    x = _inputs([0] * 16, [0] * 16, [13, 24, 33, 1], [4, 4, 4, 0], [1, 2, 3, 0], [False] * 4, [100, 100, 31, 1],
                [[-1, -1], [2, 77], [-1, -1], [-1, -1]])
    tokens = jnp.asarray([[5, 6, 0, 0], [44, 77, 0, 0], [8, 9, 10, 0], [0, 0, 0, 0]], jnp.int32)
    out = StepOutputs(tokens, jnp.asarray([2, 2, 3, 0], jnp.int32), None, None, None)
    carry = with_verify_carry(state, x, out)
    assert carry.last_tokens.tolist() == [0, 6, 77, 10]  # padding row 3 (slot 0) rewrites slot 0 as it was
    assert carry.lengths.tolist() == [0, 12, 23, 33]
    assert carry.done.tolist() == [False, False, True, True]


def verify_calls(llm: LLM) -> list[bool]:
    """Whether each verify call the runner starts from now on was chained (carried rows)."""
    runner, calls = llm.engine.runner, []
    dispatch = runner.dispatch

    def recording(host, *args, **kwargs):
        if host.drafts is not None:
            calls.append(host.carried is not None and bool(host.carried.any()))
        return dispatch(host, *args, **kwargs)

    runner.dispatch = recording
    return calls


@pytest.fixture(scope="module")
def target(checkpoint_dir):
    return checkpoint_dir("llama2")


@pytest.fixture(scope="module")
def plain(target):
    return LLM(target, **SPECULATION)


def _params(stop_at: int) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, stop_token_ids=stop)
            for n, stop in [(40, []), (33, [stop_at]), (17, []), (26, [])]]


@pytest.mark.parametrize("method", ["ngram_device", "self-draft"])
def test_chained_verify_calls_decode_as_plain(target, plain, method):
    greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    stop_at = plain.generate([PROMPTS[1]], greedy)[0].outputs[0].token_ids[21]  # inside a later call
    params = _params(stop_at)
    draft = dict(method="ngram_device") if method == "ngram_device" else dict(method="draft", draft_model=str(target))
    spec = SpeculativeConfig(**draft, num_speculative_tokens=3, adaptive=False)
    llm = LLM(target, speculative=spec, **SPECULATION)
    calls = verify_calls(llm)
    outs = summary(llm.generate(PROMPTS, params))
    assert outs == summary(plain.generate(PROMPTS, params))
    assert outs[1][0][2] == "stop" and outs[1][0][0][-1] == stop_at
    assert any(calls), calls  # verify calls were chained...
    assert llm.metrics()["engine_chained_verify_calls"] == sum(calls)  # (and counted)
    metrics = llm.engine.speculation_metrics()
    assert metrics["accepted"] > 0
    if method == "self-draft":  # ...and the draft's pool held every position they read
        assert metrics["accepted"] == metrics["drafted"]


def test_chained_verify_calls_with_an_eagle_head_decode_as_plain(tmp_path_factory):
    """The head drafts a chained call's first round from the features the call ahead stored."""
    models = tiny_target_and_heads(tmp_path_factory.mktemp("chained-eagle"))
    greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    plain = LLM(models["target"], **SPECULATION)
    params = _params(plain.generate([PROMPTS[1]], greedy)[0].outputs[0].token_ids[21])
    spec = SpeculativeConfig(method="eagle", draft_model=str(models[3]), num_speculative_tokens=3, adaptive=False)
    llm = LLM(models["target"], speculative=spec, **SPECULATION)
    calls = verify_calls(llm)
    assert summary(llm.generate(PROMPTS, params)) == summary(plain.generate(PROMPTS, params))
    assert any(calls), calls


def test_sampled_rows_draw_what_unchained_calls_draw(target, tmp_path_factory):
    """With a fixed draft length the draft model drafts the same tokens with or without chaining, so
    every draw (draft, acceptance, residual, bonus) is the same: any slip in a chained call's layout
    or carry shows as a different token."""
    draft = save_hf_model("qwen2", tmp_path_factory.mktemp("chained-draft") / "draft", num_hidden_layers=1)
    spec = SpeculativeConfig(method="draft", draft_model=str(draft), num_speculative_tokens=3, adaptive=False)
    params = [SamplingParams(max_tokens=n, temperature=0.9, top_k=40, seed=seed, ignore_eos=True)
              for seed, n in enumerate([40, 33, 17, 26])]
    outs, calls = {}, {}
    for chained in (False, True):
        llm = LLM(target, speculative=spec, async_scheduling=chained, **SPECULATION)
        calls[chained] = verify_calls(llm)
        outs[chained] = summary(llm.generate(PROMPTS, params))
    assert outs[True] == outs[False]
    assert any(calls[True]) and not any(calls[False])
