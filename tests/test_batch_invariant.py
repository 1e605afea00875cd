"""batch_invariant=True: a request's tokens and logprobs are bitwise the same whatever shares its steps.

The check runs in a child interpreter with the user's XLA flags: this session compiles at -O0
(xla_flags.py), whose code contracts no multiply-add into an FMA, and that contraction, decided by
each program's fusions, is one of the things the mode must pin (on the demo model a 1-row and a
2-row decode program differ by it at the default level).
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from python_subprocess import python_child
from xla_flags import user_xla_flags

from jaxinfer import LLM
from jaxinfer.models.invariant_weight import InvariantWeight
from jaxinfer.models.norms import layer_norm
from jaxinfer.models.self_attention import whole_heads_norm

on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu", reason="batch_invariant runs on CPUs only so far")

OUTCOMES = """
import json
from jaxinfer import DEMO_MODEL, LLM, SamplingParams

# The prompt, its 2 neighbours and the knobs are docs/engine.md's example's: its 1- and 3-row programs are these, so
# whichever of the two runs second loads them from the compilation cache instead of compiling them again.
PROMPT = "def mean(xs):"
FEW = ["import os\\n", "class A:"]
MANY = [f"import os\\nclass C{i}:\\n    def m(self):" * (1 + i % 3) for i in range(7)]
PARAMS = {"greedy": SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=2),
          "sampled": SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=3, ignore_eos=True, logprobs=2)}
llm = LLM(DEMO_MODEL, dtype="float32", batch_invariant=True)

def outcome(others, params):
    prompts = others + [PROMPT]
    sample = llm.generate(prompts, [params] * len(prompts))[-1].outputs[0]
    return [sample.token_ids, [[lp.logprob for lp in position.values()] for position in sample.logprobs]]

runs = {}
for name, params in PARAMS.items():
    llm.engine.reset_prefix_cache()
    # alone; beside 2 and 7 others (other step and decode programs); its pages cached
    runs[name] = [outcome([], params), outcome(FEW, params), outcome(MANY, params), outcome([], params)]
print(json.dumps(runs))
"""


@on_cpu
@pytest.mark.slow
def test_a_request_is_bitwise_the_same_alone_in_a_batch_and_from_the_prefix_cache():
    done = python_child(OUTCOMES, timeout=600, XLA_FLAGS=user_xla_flags(), JAXINFER_PROGRAM_STORE="0")
    assert done.returncode == 0, done.stderr[-3000:]
    for name, (alone, *others) in json.loads(done.stdout.splitlines()[-1]).items():
        assert len(alone[0]) == 16, name
        assert all(other == alone for other in others), name


@on_cpu
def test_settings_it_cannot_keep_are_refused(checkpoint_dir):
    knobs = dict(dtype="float32", max_seq_len=64, num_pages=16)
    with pytest.raises(ValueError, match="without the native CPU kernels"):
        LLM(checkpoint_dir("llama3"), **knobs, batch_invariant=True, cpu_kernels=True)
    with pytest.raises(ValueError, match="mixture-of-experts"):
        LLM(checkpoint_dir("mixtral"), **knobs, batch_invariant=True)
    with pytest.raises(TypeError, match="batch_invariant"):
        LLM(checkpoint_dir("llama3"), **knobs, batch_invariant="yes")


@pytest.mark.skipif(jax.default_backend() == "cpu", reason="checks the refusal on a GPU or TPU")
def test_other_platforms_refuse_it(checkpoint_dir):
    with pytest.raises(ValueError, match="supported on CPUs only"):
        LLM(checkpoint_dir("llama3"), dtype="float32", max_seq_len=64, num_pages=16, batch_invariant=True)


def test_q_k_norm_weights_per_head_and_dim_run_in_row_blocks():
    """q/k norm weights [heads, K] wrapped for fixed row blocks (batch_invariant_weights wraps every *norm) norm as
    the plain weights do: OLMo 2's RMSNorm over all heads, Command R+'s per-head LayerNorm."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 9, 4, 16))  # [B, T, heads, K]
    w = 1 + 0.1 * jax.random.normal(jax.random.PRNGKey(1), (4, 16))
    for norm in (whole_heads_norm, layer_norm):
        np.testing.assert_allclose(norm(x, InvariantWeight(w), 1e-5), norm(x, w, 1e-5), atol=1e-6, rtol=0)
