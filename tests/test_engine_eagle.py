"""EAGLE heads speculating inside the engine: greedy identical to plain decoding under chunked
prefill, multi-step decode, preemption and shared prefixes; the head's stored output at every
computed position equal to a from-scratch recomputation (so every program fed it the target's
true features and the right next token); the demo head accepted through the engine."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eagle_models import tiny_target_and_heads
from engine_knobs import DEMO, SPECULATION
from engine_runs import engine_ids

from jaxinfer import DEMO_EAGLE, LLM, SamplingParams, SpeculativeConfig
from jaxinfer.cache.contiguous import init_cache
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.models import forward_with_taps
from jaxinfer.speculative.eagle import EagleParams, head_step, project_features
from jaxinfer.speculative.eagle_checkpoint import load_eagle

K = 3
PROMPTS = [np.random.RandomState(i).randint(3, 250, size=n).tolist() for i, n in enumerate([5, 40, 17, 9])]
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A 3-layer tiny target (EAGLE-3 reads three of its layers), an EAGLE-1 and an EAGLE-3 head."""
    return tiny_target_and_heads(tmp_path_factory.mktemp("engine-eagle"))


def make(models, version: int | None) -> LLM:
    spec = None if version is None else SpeculativeConfig(
        method="eagle", draft_model=str(models[version]), num_speculative_tokens=K, adaptive=False, fallback=False
    )
    return LLM(models["target"], speculative=spec, **SPECULATION)


@pytest.fixture(scope="module")
def plain(models):
    return engine_ids(make(models, None), PROMPTS, GREEDY)


@pytest.fixture(scope="module", params=[1, 3], ids=["eagle1", "eagle3"])
def eagle(models, request):
    """(version, an LLM drafting with that head), shared by the tests of one version."""
    return request.param, make(models, request.param)


def test_greedy_eagle_in_engine_equals_plain(eagle, plain):
    version, llm = eagle
    assert engine_ids(llm, PROMPTS, GREEDY) == plain
    metrics = llm.engine.speculation_metrics()
    assert metrics["method"] == "eagle" and metrics["drafted"] > 0
    assert llm.engine.draft_spec.cfg.version == version  # the head the engine drafts with is the one asked for


def test_preemption_and_shared_prefixes_keep_the_output(models):
    """A 14-page pool cannot hold four 70-token sequences: requests are preempted and recomputed."""
    prompts = [PROMPTS[1], PROMPTS[1][:32] + [7, 8, 9], PROMPTS[1][:33], PROMPTS[0]]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    expected = engine_ids(make(models, None), prompts, params)
    llm = make(models, 3)
    assert engine_ids(llm, prompts, params) == expected
    engine = llm.engine.metrics()
    assert engine["num_preemptions"] > 0 and engine["prefix_cache_hits"] > 0
    assert llm.engine.speculation_metrics()["drafted"] > 0


@functools.partial(jax.jit, static_argnames=("cfg", "ecfg"))
def reference_predictions(weights, head, tokens, cfg, ecfg):
    """The head's output at positions 0..L-2 of tokens [1, L], recomputed from fresh caches: the
    target's features at every position, then the head reading (f_p, t_{p+1})."""
    length = tokens.shape[1]
    positions = jnp.arange(length)[None]
    hidden, taps, _ = forward_with_taps(weights, tokens, positions, init_cache(cfg, 1, length, jnp.float32), cfg,
                                        ecfg.feature_layers)
    features = jnp.concatenate(taps, axis=-1) if ecfg.feature_layers else hidden
    params = EagleParams(head, weights.embed, weights.lm_head)
    inputs = project_features(params, features[:, :-1], ecfg)
    cache = init_cache(ecfg.layer, 1, length, jnp.float32)
    return head_step(params, tokens[:, 1:], inputs, positions[:, :-1], cache, ecfg)[0][0]


@pytest.mark.parametrize(("stop_early", "cached", "reads"),
                         [(True, False, True), (False, False, True), (True, True, True), (True, False, False)],
                         ids=["stop_early", "all_steps", "cached_prefix", "unread_prompt"])
def test_head_output_at_every_position_equals_recomputation(models, eagle, stop_early, cached, reads, monkeypatch):
    """A 40-token prompt prefilled in chunks beside another request's decode steps, plain
    multi-step decode while a logprobs request runs (the verify step implements no logprobs), then
    verify steps: at every computed position of the running request the head's stored output is
    the recomputation's (fails if a program skips the head, feeds it a sampled token where the
    prompt's next one was known, or leaves the chain's predicted features where verified ones belong).
    all_steps: multi-step calls run every iteration after the logprobs request ends (a GPU's loop).
    cached_prefix: the prompt's full pages come from an earlier request whose head read them, so
    the head starts from their last position (a page flagged read whose outputs the head never
    wrote would hold stale values).
    unread_prompt: the prefill chunks only store their features (the engine's ragged steps while
    drafting cannot pay): the verify steps' catch-up runs the head over the whole prompt."""
    version, llm = eagle
    engine = llm.engine
    monkeypatch.setattr(engine.speculator, "reads_prompts", lambda rows: reads)
    engine.reset_prefix_cache()
    prompt = PROMPTS[1]
    if cached:  # a second turn: the first's prompt and part of its output (verify steps read that)
        prompt = prompt + engine_ids(llm, [prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0][:10]
    engine.runner.stop_early = stop_early
    drafted_before = engine.speculation_metrics()["drafted"]
    engine.add_request("logprobs", PROMPTS[3], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                              logprobs=1))
    engine.add_request("long", prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    (request,) = engine.groups["long"]
    engine.step()
    page_size = engine.config.page_size
    if cached:  # admitted with the cached pages' positions read but the last (its prefill leaves that)
        assert request.draft_computed == len(prompt) // page_size * page_size - 1 > len(PROMPTS[1])
    while len(request.output_ids) < 30:
        engine.step()
    assert engine.speculation_metrics()["drafted"] > drafted_before and not engine.groups.get("logprobs")
    cfg, weights = load_weights(models["target"], jnp.float32, progress=False)
    ecfg, head = load_eagle(models[version], cfg, jnp.float32)
    # Padded to max_seq_len: one compile per head whatever the run's length (causal, so the padding changes
    # no position read).
    tokens = np.zeros((1, SPECULATION["max_seq_len"]), np.int32)
    tokens[0, : len(request.all_ids)] = request.all_ids
    expected = reference_predictions(weights, head, jnp.asarray(tokens), cfg=cfg, ecfg=ecfg)
    positions = np.arange(request.num_computed)
    pages = np.asarray(request.pages)[positions // page_size]
    stored = np.asarray(engine.runner.draft.predicted)[pages, positions % page_size]
    engine.abort("long")
    while engine.has_unfinished():
        engine.step()
    engine.runner.stop_early = True
    np.testing.assert_allclose(stored, np.asarray(expected)[: len(positions)], rtol=1e-4, atol=1e-5)


DEMO_PROMPTS = ["def fibonacci(n):\n", "    for index, line in enumerate(lines):\n"]
DEMO_GREEDY = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)


def test_demo_head_is_exact_and_accepted_in_the_engine():
    """The shipped head, trained by scripts/train_eagle.py on the demo target: greedy output is the
    target's, and its drafts are accepted (an input off by one position, or a stale feature, would
    accept almost nothing)."""
    expected = engine_ids(LLM(**DEMO), DEMO_PROMPTS, DEMO_GREEDY)
    spec = SpeculativeConfig(method="eagle", draft_model=str(DEMO_EAGLE), num_speculative_tokens=4, adaptive=False)
    llm = LLM(speculative=spec, **DEMO)
    assert engine_ids(llm, DEMO_PROMPTS, DEMO_GREEDY) == expected
    assert llm.engine.speculation_metrics()["acceptance_rate"] > 0.35, llm.engine.speculation_metrics()
