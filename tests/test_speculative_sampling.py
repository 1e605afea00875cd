"""Speculative sampling is lossless: token distributions match the target's exactly.

Many seeds of one prompt on a 16-token vocabulary run as one batch; the empirical distribution of
the 2nd, 3rd and 4th generated tokens (the first is prefill's, not speculative) is tested against
the exact marginal computed from target logits, with temperature, top-k and top-p set. With
K = 2 drafts the 2nd and 3rd are the first round's drafted positions and the 4th its position K,
where the bonus token lands when both drafts are accepted. The same test must reject
deliberately broken acceptance rules.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from eagle_models import save_eagle1
from hf_models import save_hf_model
from scipy import stats

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.cache.contiguous import init_cache
from jaxinfer.runtime import step_programs
from jaxinfer.sampling.sampler import processed_logprobs, sampling_arrays
from jaxinfer.speculative import AcceptanceRule
from jaxinfer.speculative.rejection import exact_accept, exact_residual

VOCAB = 16
ROWS = 2048
# Holds every vocabulary id, so prompt lookup finds a match (and drafts) for every sampled token.
PROMPT = [3, 4, 5, 3, 4, 5, 3, 4, 0, 1, 2, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
PARAMS = dict(max_tokens=4, temperature=0.9, top_k=8, top_p=0.9, ignore_eos=True)
MAX_PREFIXES = PARAMS["top_k"] ** 3  # the exact marginals' deepest level: top-k keeps at most 8 tokens a position
ALWAYS_ACCEPT = AcceptanceRule(accept=lambda p, q, u: u < 2.0, residual=exact_residual)
RESAMPLE_FROM_P = AcceptanceRule(accept=exact_accept, residual=lambda p, q: p)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec_stats")
    target = save_hf_model("llama2", root / "target", vocab_size=VOCAB)
    return {
        "target": target,
        "draft": save_hf_model("qwen2", root / "draft", vocab_size=VOCAB, num_hidden_layers=1),
        "eagle": save_eagle1(root / "eagle", target),  # a random EAGLE-1 head over the target's features
    }


@pytest.fixture(scope="module")
def exact(models):
    """Exact marginals [3, V] of the 2nd, 3rd and 4th generated tokens under the processed target."""
    llm = LLM(models["target"], dtype="float32", max_seq_len=32)
    paths, marginals = {(): 1.0}, []
    for depth in range(4):
        prefixes = list(paths)
        probs = next_token_probs(llm, [PROMPT + list(x) for x in prefixes])
        weights = np.asarray([paths[x] for x in prefixes])
        if depth:
            marginals.append(weights @ probs)
        paths = {x + (int(t),): paths[x] * probs[i, t] for i, x in enumerate(prefixes) for t in np.flatnonzero(probs[i])}
    return np.stack(marginals)


def next_token_probs(llm: LLM, prefixes: list[list[int]]) -> np.ndarray:
    """Processed target probabilities [N, V] after each prefix (all of one length), in one forward.

    The forward runs MAX_PREFIXES rows whatever N (the rest zeros, ignored): one program and one set of
    sampling ops for the four depths, not four (~2 s of compiling from an empty cache)."""
    n, width = len(prefixes[0]), 32
    tokens = np.zeros((MAX_PREFIXES, width), np.int32)
    tokens[: len(prefixes), :n] = prefixes
    cache = init_cache(llm.config, MAX_PREFIXES, width, llm.dtype, llm.cpu_kernels)
    logits = step_programs.all_logits(llm._run_weights, jnp.asarray(tokens), cache, cfg=llm.config)[:, n - 1]
    arrays = sampling_arrays([SamplingParams(**PARAMS)] * MAX_PREFIXES, [0] * MAX_PREFIXES)
    return np.exp(np.asarray(processed_logprobs(logits, arrays), np.float64))[: len(prefixes)]


def sampled(models, spec: SpeculativeConfig | None) -> np.ndarray:
    """Generated tokens 2 to 4 [ROWS, 3] of ROWS seeds in one batch."""
    # The engine admits every row in one step, so all of them decode (and draft) together. A budget of exactly the
    # prompts' tokens is the top token bucket: ROWS * 32 padded their 43,008 tokens to 65,536.
    llm = LLM(
        models["target"], dtype="float32", max_seq_len=32, max_num_seqs=ROWS, speculative=spec,
        max_prefill_seqs=ROWS, max_num_batched_tokens=ROWS * len(PROMPT),
    )
    params = [SamplingParams(**PARAMS, seed=seed) for seed in range(ROWS)]
    ids = [o.token_ids for o in llm.generate([PROMPT] * ROWS, params)]
    if spec is not None:  # fixed lengths draft for most rows, the adaptive plan for some
        assert llm.metrics()["drafted"] > (ROWS // 2 if not spec.adaptive else 0), llm.metrics()
    return np.asarray([ids[1:4] for ids in ids])


def fit_pvalue(tokens: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit; tokens outside the support fail outright, rare bins are pooled."""
    counts = np.bincount(tokens, minlength=VOCAB)
    if np.any(counts[probs == 0]):
        return 0.0
    expected = probs * len(tokens)
    big = expected >= 5
    obs = np.append(counts[big], counts[~big & (probs > 0)].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


def spec_config(method: str, models, rule: AcceptanceRule | None = None, adaptive: bool = False) -> SpeculativeConfig:
    extra = {"rule": rule} if rule is not None else {}
    # "self" drafts with the target itself: every draft is accepted, so every 4th token is a bonus.
    draft = {"draft": models["draft"], "self": models["target"], "eagle": models["eagle"]}.get(method)
    draft = None if draft is None else str(draft)
    method = "draft" if method == "self" else method
    # ROWS sequences saturate the default verify budget, and rows without an n-gram match share
    # each round, so the heuristic cost model would rarely draft; free verification and drafts
    # keep the adaptive path under test. Adaptive cases plan with those heuristic costs only
    # (calibrate=False): the step times this machine measures would decide whether 2048 rows draft.
    return SpeculativeConfig(
        method, draft, num_speculative_tokens=2, adaptive=adaptive, calibrate=not adaptive,
        verify_saturation_tokens=2**30, draft_cost=0.0, min_gain=1.0, **extra,
    )


@pytest.mark.parametrize(
    "method,adaptive",
    [
        (None, False), ("draft", False), ("self", False), ("draft", True), ("ngram", False), ("ngram", True),
        ("eagle", False), ("suffix", False), ("suffix", True), ("ngram_device", False),
    ],
    ids=["plain", "draft-model", "self-draft", "draft-adaptive-heuristic", "ngram", "ngram-adaptive", "eagle-head",
         "suffix", "suffix-adaptive", "ngram-device"],
)
def test_sampling_matches_target_distribution(models, exact, method, adaptive):
    """Every method speculates in the engine (suffix drafts from the prompt and every row's output
    so far: other rows' samples, shared while they run)."""
    spec = spec_config(method, models, adaptive=adaptive) if method else None
    tokens = sampled(models, spec)
    for position in range(3):
        assert fit_pvalue(tokens[:, position], exact[position]) > 1e-3


@pytest.mark.parametrize(
    "method,rule",
    [("draft", ALWAYS_ACCEPT), ("draft", RESAMPLE_FROM_P), ("ngram", ALWAYS_ACCEPT), ("eagle", ALWAYS_ACCEPT),
     ("eagle", RESAMPLE_FROM_P), ("suffix", ALWAYS_ACCEPT), ("ngram_device", ALWAYS_ACCEPT)],
    ids=["draft-always-accept", "draft-resample-from-p", "ngram-always-accept", "eagle-always-accept",
         "eagle-resample-from-p", "suffix-always-accept", "ngram-device-always-accept"],
)
def test_broken_acceptance_rule_is_caught(models, exact, method, rule):
    tokens = sampled(models, spec_config(method, models, rule))
    assert min(fit_pvalue(tokens[:, position], exact[position]) for position in range(3)) < 1e-6
