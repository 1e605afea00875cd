"""One side's run: greedy outputs, a timed greedy pass, sampled completions and teacher-forced log-probabilities.

Requests go to the serving engine, as `jaxinfer serve` and `LLM.stream` send them, so the run
measures what serving runs (speculation and the KV cache included) and can read the page pool's
use after every step. Teacher forcing reads `LLM.logits`: the weights and dtype a configuration
loads, not its KV cache or speculation, which the greedy and sampled runs compare.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine import RequestOutput
from jaxinfer.entrypoints.compare.configs import Configuration
from jaxinfer.entrypoints.compare.quality import log_softmax
from jaxinfer.entrypoints.compare.workload import Workload, held_out_windows
from jaxinfer.entrypoints.llm import LLM
from jaxinfer.parallel.array_info import tree_bytes

SAMPLE_SEED_STRIDE = 1_000_003  # B's sample seeds start here: independent of A's, as the test assumes
_request_numbers = itertools.count()


@dataclasses.dataclass
class Cost:
    """What one side's timed greedy pass cost."""

    seconds: float
    generated_tokens: int
    ttft: list[float]  # per request, seconds
    tpot: list[float]
    weight_bytes: int
    kv_pool_bytes: int | None = None  # the page pool as allocated
    kv_peak_bytes: int | None = None  # its pages referenced at the fullest step
    kv_bytes_per_token: float | None = None
    includes_compilation: bool = False  # timed on the first pass (no warm-up pass)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over the pass's wall time."""
        return self.generated_tokens / self.seconds if self.seconds > 0 else float("nan")


@dataclasses.dataclass
class Run:
    """Everything one side produced on the workload."""

    label: str
    config: dict[str, str]
    model_dir: str
    dtype: str
    prompt_ids: list[list[int]]
    greedy: list[list[int]]  # per prompt
    sampled: list[np.ndarray]  # per sampled prompt: [samples, sample_tokens]
    forced_texts: list[list[int]]  # held-out windows, then each prompt with A's greedy output
    logprobs: list[np.ndarray]  # per forced text: [T, V] float32
    held_out_count: int  # how many of forced_texts are held-out windows
    cost: Cost


def run_requests(llm: LLM, prompts: Sequence[str | list[int]], params: Sequence[SamplingParams]
                 ) -> tuple[list[RequestOutput], float, float]:
    """Outputs in order, wall seconds and the peak fraction of the page pool in use after any step."""
    engine = llm.engine
    ids = [f"compare-{next(_request_numbers)}" for _ in prompts]
    finals: dict[str, RequestOutput] = {}
    peak, start = 0.0, time.perf_counter()
    try:
        for request_id, prompt, p in zip(ids, prompts, params):
            engine.add_request(request_id, prompt, p)
        while engine.has_unfinished():
            finals.update((out.request_id, out) for out in engine.step(final_only=True))
            peak = max(peak, engine.metrics()["kv_cache_usage_perc"])
    except BaseException:  # Ctrl-C too: the engine must not keep running these
        for request_id in ids:
            engine.abort(request_id)
        while engine.has_unfinished():
            engine.step()
        raise
    return [finals[request_id] for request_id in ids], time.perf_counter() - start, peak


def greedy_params(workload: Workload) -> SamplingParams:
    """Greedy to max_tokens; EOS ignored so every position of every output is compared."""
    return SamplingParams(max_tokens=workload.max_tokens, temperature=0.0, ignore_eos=True)


def sample_params(workload: Workload, side: int) -> list[SamplingParams]:
    """One seeded request per completion of every sampled prompt; side 1 (B) draws other seeds."""
    base = workload.seed + side * SAMPLE_SEED_STRIDE
    count = workload.samples * len(workload.sampled)
    return [SamplingParams(max_tokens=workload.sample_tokens, temperature=workload.temperature, seed=base + i,
                           ignore_eos=True) for i in range(count)]


def timed_cost(llm: LLM, workload: Workload, warm: bool, first: tuple[list[RequestOutput], float, float]) -> Cost:
    """Cost of the greedy pass, re-run on warm programs with an empty prefix cache unless `warm` is False."""
    outputs, seconds, peak = first
    if warm:
        llm.engine.reset_prefix_cache()
        outputs, seconds, peak = run_requests(llm, workload.prompts, [greedy_params(workload)] * len(workload.prompts))
    pages = llm.engine.runner.pages
    pool = tree_bytes(pages) if pages is not None else None
    slots = llm.engine.blocks.num_pages * llm.engine.blocks.page_size
    return Cost(
        seconds=seconds, generated_tokens=sum(len(o.token_ids) for o in outputs),
        ttft=[o.metrics.time_to_first_token for o in outputs if o.metrics and o.metrics.time_to_first_token is not None],
        tpot=[o.metrics.time_per_output_token for o in outputs if o.metrics and o.metrics.time_per_output_token is not None],
        # What the running model holds (packed tiles, joined projections), not `LLM.weights`' unpacked copy.
        weight_bytes=tree_bytes(llm._run_weights),
        kv_pool_bytes=pool, kv_peak_bytes=None if pool is None else int(peak * pool),
        kv_bytes_per_token=None if pool is None else pool / slots, includes_compilation=not warm,
    )


def forced_logprobs(logits: Callable[[list[int]], np.ndarray], texts: list[list[int]]) -> list[np.ndarray]:
    """Log-probabilities [T, V] of each text's next tokens."""
    return [log_softmax(np.asarray(logits(ids))) for ids in texts]


def sampled_tokens(outputs: list[RequestOutput], workload: Workload) -> list[np.ndarray]:
    """The sampled completions grouped per prompt: [samples, sample_tokens] each."""
    tokens = np.array([o.token_ids for o in outputs], dtype=np.int64)
    return list(tokens.reshape(len(workload.sampled), workload.samples, workload.sample_tokens))


def forced_texts_of(encode: Callable[[str], list[int]], workload: Workload, prompt_ids: list[list[int]],
                    greedy: list[list[int]]) -> tuple[list[list[int]], int]:
    """The texts both sides score: the held-out windows, then every prompt followed by A's greedy output."""
    windows = held_out_windows(workload, encode)
    return windows + [p + g for p, g in zip(prompt_ids, greedy)], len(windows)


def run_llm(config: Configuration, workload: Workload, side: int, forced: tuple[list[list[int]], int] | None,
            warm: bool = True) -> Run:
    """Run the workload on a jaxinfer configuration (loaded here unless it carries its LLM, then freed)."""
    llm = config.llm or LLM(**config.kwargs)
    try:
        params = [greedy_params(workload)] * len(workload.prompts)
        first = run_requests(llm, workload.prompts, params)
        greedy = [list(o.token_ids) for o in first[0]]
        prompt_ids = [list(o.prompt_token_ids) for o in first[0]]
        cost = timed_cost(llm, workload, warm, first)
        sampled = []
        if workload.sample_prompts:
            prompts = [p for p in workload.sampled for _ in range(workload.samples)]
            sampled = sampled_tokens(run_requests(llm, prompts, sample_params(workload, side))[0], workload)
        texts, held = forced or forced_texts_of(llm.tokenize, workload, prompt_ids, greedy)
        logprobs = forced_logprobs(llm.logits, texts)
        return Run(config.label, config.describe(), str(llm.model_dir), jnp.dtype(llm.dtype).name, prompt_ids, greedy, sampled,
                   texts, logprobs, held, cost)
    finally:
        if config.llm is None:
            llm.close()
