"""Suffix decoding inside the engine: greedy identical to plain decoding (prefix caching, n > 1, a
batch mix, through LLM.generate and the engine's own steps), and later requests drafting from
earlier ones' outputs. (The sampled distribution is tested in test_speculative_sampling; the
trees against a brute-force reference in test_suffix_cache.)"""

from __future__ import annotations

import numpy as np
import pytest
from engine_knobs import DEMO, ENGINE
from engine_runs import engine_ids

from jaxinfer import DEMO_MODEL, LLM, SamplingParams, SpeculativeConfig

K = 3
LOOP = [21, 22, 23, 24, 25, 26] * 4
PROMPTS = [LOOP, LOOP[:9] + [40, 41] + LOOP[:9], *[np.random.RandomState(i).randint(3, 250, size=n).tolist()
                                                  for i, n in enumerate([5, 30])]]
GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(checkpoint_dir):
    return checkpoint_dir("llama3")


def make(model, method: str | None = "suffix", **spec) -> LLM:
    config = None if method is None else SpeculativeConfig(method=method, num_speculative_tokens=K, **spec)
    return LLM(model, speculative=config, **ENGINE)


@pytest.fixture(scope="module")
def plain(model):
    return make(model, None)


def token_ids(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [out.token_ids for out in llm.generate(prompts, params)]


@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_equals_plain_in_a_batch_mix(model, plain, adaptive):
    """Drafting rows beside a stop inside an accepted run, a penalized row, a logprobs row and n = 2."""
    llm = make(model, adaptive=adaptive, suffix_max_spec_factor=4.0)
    assert token_ids(llm, PROMPTS) == token_ids(plain, PROMPTS)
    free = token_ids(plain, [LOOP])[0]
    params = [
        SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[free[5]]),
        SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0, logprobs=2, ignore_eos=True),
        SamplingParams(max_tokens=16, temperature=0, n=2, ignore_eos=True),
    ]
    prompts = [LOOP, PROMPTS[1], PROMPTS[2], PROMPTS[3]]
    got, expected = llm.generate(prompts, params), plain.generate(prompts, params)
    assert [[s.token_ids for s in o.outputs] for o in got] == [[s.token_ids for s in o.outputs] for o in expected]
    assert [o.finish_reason for o in got] == [o.finish_reason for o in expected]
    assert llm.metrics()["spec_decode_num_draft_tokens"] > 0


def test_engine_steps_with_prefix_caching_and_preemption_keep_outputs(model, plain):
    """Long loops that do not fit the pool together (preempted mid-speculation); the last prompt
    starts with the first's full pages (a prefix-cache hit)."""
    llm = make(model, adaptive=False)
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    prompts = [LOOP, LOOP[1:], LOOP[2:], LOOP + PROMPTS[3][:6]]
    assert engine_ids(llm, prompts, params) == engine_ids(plain, prompts, params)
    metrics = llm.metrics()
    assert metrics["num_preemptions"] > 0 and metrics["prefix_cache_hits"] > 0 and metrics["accepted"] > 0


def test_later_requests_draft_from_earlier_outputs():
    """Unit-test stubs for four classes, one request after another (the demo model writes the same
    docstring and body for each): from the second on, suffix decoding drafts from the earlier
    outputs and emits more per target pass than n-gram, which sees only the request's own tokens."""
    prompts = [f"import unittest\n\n\nclass Test{name}(unittest.TestCase):\n    def test_{method}(self):\n"
               for name, method in [("Parser", "parse"), ("Stack", "push"), ("Queue", "pop"), ("Cache", "get")]]
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    passes, outputs = {}, {}
    for method in ("ngram", "suffix"):
        llm = LLM(DEMO_MODEL, speculative=SpeculativeConfig(method, adaptive=False), **DEMO)
        outs = [llm.generate(prompt, params)[0] for prompt in prompts]
        passes[method] = np.asarray([o.spec_stats["tokens_per_target_pass"] for o in outs])
        outputs[method] = [o.token_ids for o in outs]
        del llm
    assert outputs["suffix"] == outputs["ngram"]  # both equal plain decoding (greedy, exact)
    assert np.all(passes["suffix"][1:] > passes["ngram"][1:] + 0.5), passes
    assert np.all(passes["suffix"][1:] > passes["suffix"][0]), passes


def test_no_shared_outputs_when_the_cache_holds_none(model):
    """suffix_max_cached_requests=0: a request drafts from its own tokens only."""
    llm = make(model, adaptive=False, suffix_max_cached_requests=0, suffix_max_spec_factor=4.0)
    stats = [llm.generate([PROMPTS[3]], GREEDY)[0].spec_stats["tokens_per_target_pass"] for _ in range(2)]
    assert stats[1] == stats[0]
    assert llm.engine.speculator.suffix.cache.shared.num_nodes == 1


def test_a_disabled_speculator_lets_go_of_the_tries():
    """The server's fallback disables speculation for good: no request stays referenced by the tries."""
    from jaxinfer.engine.speculation import Speculator

    speculator = Speculator(SpeculativeConfig(method="suffix"))
    assert speculator.suffix is not None
    speculator.disable("shadow disagreement")
    assert speculator.suffix is None and speculator.plan([], 1) is None
