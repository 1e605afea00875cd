"""The serving engine against the plain path: greedy identical under every scheduling choice."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from engine_knobs import ENGINE
from jax import monitoring

from jaxinfer import LLM, SamplingParams
from jaxinfer.engine.metrics import StepClock
from jaxinfer.engine.outputs import accumulate

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
PROMPTS = [np.random.RandomState(i).randint(3, 250, size=n).tolist() for i, n in enumerate([5, 37, 9, 21, 1, 50])]
SHARED = np.random.RandomState(99).randint(3, 250, size=40).tolist()
SHARED_PROMPTS = [SHARED + p[:6] for p in PROMPTS[:4]]


@pytest.fixture(scope="module")
def model(checkpoint_dir):
    return checkpoint_dir("llama3")


def make(model, **knobs) -> LLM:
    """An engine on the shared knobs (its pool of 15 pages makes the longer workloads preempt), prefilling
    one prompt a step, as the step-by-step tests here count on (a knob no program's shape depends on)."""
    return LLM(model, **{**ENGINE, "max_prefill_seqs": 1, **knobs})


@pytest.fixture(scope="module")
def llm(model):
    return make(model)


def full_recompute_greedy(llm: LLM, prompt: list[int], n: int) -> list[int]:
    """The plain reference: re-run the whole sequence through the dense path for every token."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(llm.logits(ids)[-1])))
    return ids[len(prompt) :]


def greedy_ids(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [out.token_ids for out in llm.generate(prompts, params)]


def test_engine_greedy_matches_full_recompute(llm):
    outputs = greedy_ids(llm, PROMPTS)
    for prompt, got in zip(PROMPTS, outputs):
        assert got == full_recompute_greedy(llm, prompt, GREEDY.max_tokens)


def test_each_request_alone_equals_mixed_batch(llm):
    mixed = greedy_ids(llm, PROMPTS)
    assert [greedy_ids(llm, [p])[0] for p in PROMPTS] == mixed


def test_prefix_caching_hits_and_keeps_outputs(model, llm):
    uncached = make(model, enable_prefix_caching=False)
    expected = greedy_ids(uncached, SHARED_PROMPTS)
    before = llm.metrics()["prefix_cache_hits"]
    assert greedy_ids(llm, SHARED_PROMPTS[:1]) == expected[:1]
    assert greedy_ids(llm, SHARED_PROMPTS) == expected
    assert llm.metrics()["prefix_cache_hits"] - before >= 3 * 32  # two full pages per later request
    assert uncached.metrics()["prefix_cache_hits"] == 0


def test_preemption_by_recompute_keeps_outputs(llm):
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    before = llm.metrics()["num_preemptions"]
    outputs = greedy_ids(llm, PROMPTS[:4], params)
    assert llm.metrics()["num_preemptions"] > before  # 4 + 6 + 4 + 5 pages do not fit in 15
    for prompt, got in zip(PROMPTS[:4], outputs):
        assert got == full_recompute_greedy(llm, prompt, params.max_tokens)


def test_decode_steps_one_and_many_agree(model, llm):
    single = make(model, decode_steps=1)
    params = SamplingParams(max_tokens=30, temperature=0, stop_token_ids=[7, 11, 13])
    assert greedy_ids(single, PROMPTS, params) == greedy_ids(llm, PROMPTS, params)


@pytest.mark.parametrize("stop_early,long_tokens", [(True, 1), (False, ENGINE["decode_steps"])])
def test_multi_step_call_stops_at_a_finish_only_when_asked(llm, stop_early, long_tokens):
    """A row finishing one token into a 4-step call ends the call (stop_early, CPU's choice) or
    idles while the others run all 4 steps (a GPU's: no per-iteration round trip)."""
    engine, before = llm.engine, llm.engine.runner.stop_early
    engine.runner.stop_early = stop_early
    try:
        engine.add_request("short", PROMPTS[0], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
        engine.add_request("long", PROMPTS[2], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
        short = engine.groups["short"][0]
        while any(r.prefilling or not r.output_ids for group in engine.groups.values() for r in group):
            engine.step()  # prefill steps: one token per row
        assert len(short.output_ids) == 2  # one left: it finishes one token into the next call
        deltas = {d.request_id: d for d in engine.step()}  # the first all-decode call
        assert deltas["short"].finished and len(deltas["long"].outputs[0].token_ids) == long_tokens
        while engine.has_unfinished():
            engine.step()
    finally:
        engine.runner.stop_early = before


def test_fixed_trip_engine_runs_single_steps_as_ragged_steps(llm):
    """Where multi-step decode runs all its iterations (a GPU), a call of one step (a streamed row here)
    takes the ragged program instead, computing one token per row; outputs stay those of the plain path."""
    engine, before = llm.engine, llm.engine.runner.stop_early
    expected = greedy_ids(llm, PROMPTS[:2])
    paced = engine.scheduler.config
    engine.runner.stop_early = False
    engine.scheduler.config = dataclasses.replace(paced, stream_interval=1)
    kinds = []
    build = engine._build_step

    def recording(schedule):
        host = build(schedule)
        kinds.append((host.decode, any(row.request.streamed for row in schedule.decodes)))
        return host

    engine._build_step = recording
    try:
        engine.add_request("watched", PROMPTS[0], GREEDY, streamed=True)
        engine.add_request("other", PROMPTS[1], GREEDY)
        got = {}
        while engine.has_unfinished():
            for delta in engine.step():
                got.setdefault(delta.request_id, []).extend(delta.outputs[0].token_ids)
    finally:
        engine.runner.stop_early, engine.scheduler.config = before, paced
        del engine._build_step
    assert [got["watched"], got["other"]] == expected
    assert (True, True) not in kinds, "a one-step call ran the multi-step program"
    assert (True, False) in kinds  # once the stream finished, the other request took several steps a call


def test_seeded_sampling_does_not_depend_on_batch_or_steps(model, llm):
    params = SamplingParams(max_tokens=16, temperature=0.9, top_k=40, seed=5, ignore_eos=True)
    single = make(model, decode_steps=1)
    alone = greedy_ids(single, PROMPTS[1:2], params)[0]
    assert greedy_ids(llm, PROMPTS, params)[1] == alone


def test_abort_frees_every_page(llm):
    engine = llm.engine
    free_before = engine.blocks.usable_pages
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"abort-{i}", prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.blocks.usable_pages < free_before
    for i in range(len(PROMPTS)):
        engine.abort(f"abort-{i}")
    finals = engine.step()
    assert {o.request_id for o in finals} == {f"abort-{i}" for i in range(len(PROMPTS))}
    assert all(o.finished and o.finish_reason == "abort" for o in finals)
    assert engine.blocks.usable_pages == free_before and not engine.has_unfinished()


def run_steps(engine, prompts, params, final_only: bool) -> dict:
    engine.reset_prefix_cache()  # both runs compute the same way (cached pages give other logprob roundings)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"kind-{i}", prompt, params)
    totals = {}
    while engine.has_unfinished():
        for out in engine.step(final_only=final_only):
            assert out.finished or not final_only
            assert out.request_id not in totals or not final_only  # once each
            totals[out.request_id] = accumulate(totals.get(out.request_id), out)
    return totals


def test_final_only_steps_give_each_request_once_as_the_deltas_add_up(llm):
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=2, n=2, seed=3)
    deltas = run_steps(llm.engine, PROMPTS[:4], params, final_only=False)
    finals = run_steps(llm.engine, PROMPTS[:4], params, final_only=True)
    assert finals.keys() == deltas.keys() and len(finals) == 4
    for request_id, total in deltas.items():
        for whole, added in zip(finals[request_id].outputs, total.outputs):
            assert (whole.token_ids, whole.text, whole.logprobs) == (added.token_ids, added.text, added.logprobs)
            assert len(whole.token_ids) == 20


def test_invalid_requests_among_32_running_change_nothing(model):
    # Short prompts and a 256-token budget admit all 32 in the first step, so they decode together.
    llm = make(model, max_num_seqs=32, max_num_batched_tokens=256, max_prefill_seqs=32, num_pages=72)
    prompts = [np.random.RandomState(100 + i).randint(3, 250, size=3 + i % 6).tolist() for i in range(32)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    expected = greedy_ids(llm, prompts, params)
    engine, finals = llm.engine, {}
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    for _ in range(2):
        for out in engine.step():
            finals.setdefault(out.request_id, []).extend(out.token_ids)
    assert len(engine.scheduler.running) == 32 and not engine.scheduler.waiting
    assert all(0 < len(finals[str(i)]) < params.max_tokens for i in range(32))  # mid-decode
    usage = engine.blocks.usage
    invalid = [
        (prompts[0], SamplingParams(max_tokens=95, temperature=0), ValueError, "exceeds max_seq_len"),
        (prompts[0], {"temperature": -1.0}, TypeError, "params must be a SamplingParams"),
        (list(range(3, 100)), params, ValueError, "exceeds max_seq_len"),
        ([1, 10**6], params, ValueError, "outside the vocabulary"),
        ([1, -2], params, ValueError, "outside the vocabulary"),
        ([1, 2.5], params, TypeError, "must be integers"),
        ([], params, ValueError, "prompt is empty"),
    ]
    for k, (prompt, bad_params, error, message) in enumerate(invalid):
        with pytest.raises(error, match=message):
            engine.add_request(f"bad-{k}", prompt, bad_params)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("3", [1, 2], params)
    assert not engine.scheduler.waiting and not any(rid.startswith("bad") for rid in engine.groups)
    assert engine.blocks.usage == usage
    while engine.has_unfinished():
        for out in engine.step():
            finals.setdefault(out.request_id, []).extend(out.token_ids)
    assert set(finals) == {str(i) for i in range(32)}
    assert [finals[str(i)] for i in range(32)] == expected


def test_one_failing_request_fails_alone(llm):
    engine = llm.engine
    for i, prompt in enumerate(PROMPTS[:3]):
        engine.add_request(f"f{i}", prompt, GREEDY)

    class Broken:
        def push(self, ids):
            raise RuntimeError("detokenizer exploded")

    engine.groups["f1"][0].detokenizer = Broken()
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            finals[out.request_id] = out
    assert finals["f1"].finish_reason == "error" and "exploded" in finals["f1"].error
    assert finals["f0"].finish_reason == finals["f2"].finish_reason == "length"


def test_no_compiles_after_warmup(model, capsys):
    llm = make(model)
    count = llm.engine.warmup(progress=True)
    assert f"{count}/{count}" in capsys.readouterr().err  # the bar counted every program
    traces = []
    monitoring.register_event_duration_secs_listener(
        lambda name, *a, **k: traces.append(name) if name.endswith("jaxpr_trace_duration") else None
    )
    # A logit bias is data of every step program, not a variant to compile.
    params = [SamplingParams(max_tokens=n, temperature=t, seed=1, logit_bias=bias)
              for n, t, bias in [(9, 0, None), (20, 0.8, {7: 5.0, 9: -100}), (3, 1.0, None)]]
    llm.generate([PROMPTS[0], PROMPTS[1], PROMPTS[3]], params)
    llm.generate(PROMPTS[4:], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    assert count > 4 and traces == []


STEP_PROGRAMS = ("jit(ragged_step)", "jit(multi_decode)")


def test_parallel_warmup_compiles_each_program_once(model):
    """Programs compiled on worker threads are the ones the runs use: each step program compiles
    once in the warm-up (with the penalty-slot reset and prompt-logprobs passes), and a workload
    afterwards compiles none."""
    compiled, counting = [], [True]

    def count_step_compiles(name: str, *args, fun_name: str = "", **kwargs) -> None:
        if counting[0] and name.endswith("backend_compile_duration") and fun_name in STEP_PROGRAMS:
            compiled.append(fun_name)

    monitoring.register_event_duration_secs_listener(count_step_compiles)
    llm = make(model, max_num_seqs=2, max_num_batched_tokens=16, decode_steps=2, page_size=32)  # shapes no other test compiles
    count = llm.engine.warmup(threads=2)
    assert count == llm.engine.program_count() and len(compiled) == len(llm.engine.step_hosts()) >= 3
    llm.generate(PROMPTS[:3], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    counting[0] = False
    assert len(compiled) == len(llm.engine.step_hosts())


def test_step_times_split_into_device_wait_and_host(llm):
    before = llm.metrics()
    greedy_ids(llm, PROMPTS[:2])
    after = llm.metrics()
    steps = after["engine_steps"] - before["engine_steps"]
    seconds = after["engine_step_seconds"] - before["engine_step_seconds"]
    wait = after["engine_device_wait_seconds"] - before["engine_device_wait_seconds"]
    assert steps >= 3 and 0 < wait < seconds  # two prefills and at least one decode call
    phases = {p: after["engine_phase_seconds"][p] - before["engine_phase_seconds"].get(p, 0.0) for p in StepClock.PHASES}
    assert all(t > 0 for t in phases.values()), phases
    assert sum(phases.values()) == pytest.approx(seconds) and phases["dispatch"] + phases["outputs"] == pytest.approx(wait)
    overlapped = after["engine_overlapped_seconds"] - before["engine_overlapped_seconds"]
    # outputs built while the next call ran; in chained steps (async_scheduling) every host phase
    chained = after["engine_chained_calls"] > before["engine_chained_calls"]
    assert phases["overlapped"] - 1e-9 <= overlapped <= seconds - wait + 1e-9
    assert (overlapped > phases["overlapped"] + 1e-9) == chained


def test_padding_and_input_bytes_are_counted(llm):
    """Every device call counts the token positions it computed (>= the scheduled ones) and the
    bytes its inputs took to the device."""
    before = llm.metrics()
    greedy_ids(llm, PROMPTS[:2])
    after = llm.metrics()
    slots, real, sent = (after[k] - before[k] for k in ("engine_token_slots", "engine_real_tokens", "engine_input_bytes"))
    assert slots >= real > 0 and sent > 0


def test_pages_a_finished_request_filled_in_its_last_call_stay_cached(model, llm):
    """A next turn (the prompt, the reply, more) reuses every page the first turn filled, those of the
    call that ended it too (a reply of 9 tokens fills the third page in its last call)."""
    prompt = np.random.RandomState(5).randint(3, 250, size=40).tolist()
    (reply,) = greedy_ids(llm, [prompt], SamplingParams(max_tokens=9, temperature=0, ignore_eos=True))
    next_turn = prompt + reply + [7, 8]
    before = llm.metrics()["prefix_cache_hits"]
    assert greedy_ids(llm, [next_turn]) == greedy_ids(make(model, enable_prefix_caching=False), [next_turn])
    assert llm.metrics()["prefix_cache_hits"] - before == 48  # positions 0-47: three full pages


def test_reset_prefix_cache_frees_cached_pages(llm):
    greedy_ids(llm, SHARED_PROMPTS[:2])
    blocks = llm.engine.blocks
    assert blocks.evictable and blocks.by_hash
    llm.engine.reset_prefix_cache()
    assert not blocks.evictable and not blocks.by_hash and blocks.usable_pages == blocks.num_pages - 1
    assert greedy_ids(llm, SHARED_PROMPTS[:2]) == greedy_ids(llm, SHARED_PROMPTS[:2])


def test_prefix_counters_count_admitted_requests_once_and_outlive_a_release(llm):
    engine = llm.engine
    prompt = SHARED + [5, 6, 7, 8, 9, 10]  # 46 tokens: two full pages are cached after its prefill
    engine.reset_prefix_cache()  # no other cached pages to evict for it
    greedy_ids(llm, [prompt], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    before = llm.metrics()
    held = engine.blocks.allocate(len(engine.blocks.free))  # every free page: only the cached ones are left
    engine.add_request("waits", prompt, GREEDY)
    for _ in range(3):
        engine.step()  # its third page does not fit: it stays waiting, looked up again each step
    assert [r.request_id for r in engine.scheduler.waiting] == ["waits"]
    engine.blocks.release(held)
    while engine.has_unfinished():
        engine.step()
    after = llm.metrics()
    assert after["prefix_cache_queries"] - before["prefix_cache_queries"] == len(prompt)
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] == 32
    engine.release()  # a fresh block manager (as after a failed step): the totals stay
    assert {k: llm.metrics()[k] for k in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions")} == {
        k: after[k] for k in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions")
    }
