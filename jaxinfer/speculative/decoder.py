"""Host side of speculative decoding for `LLM`: builds the proposer, runs the compiled loop, falls back.

Anything that makes the draft unusable (missing or unsupported checkpoint, a different
tokenizer, a compile or runtime failure) disables speculation with a warning saying why;
`LLM.generate` then decodes plainly, so no request is lost.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import jax

from jaxinfer.cache.contiguous import KVCache
from jaxinfer.cache.donation import is_consumed
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.checkpoint.tokenizer import load_tokenizer
from jaxinfer.config.buckets import bucket
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import Weights, weights_to_run
from jaxinfer.models.contiguous_decode import DecodeState
from jaxinfer.parallel.sharding import UNSHARDED, Layout, to_host
from jaxinfer.speculative import programs
from jaxinfer.speculative.acceptance_summary import SpecMetrics, request_stats
from jaxinfer.speculative.config import SpeculativeConfig
from jaxinfer.speculative.costs import calibrate, device_heuristic_costs
from jaxinfer.speculative.eagle import pack_eagle
from jaxinfer.speculative.eagle_checkpoint import load_eagle
from jaxinfer.speculative.eagle_proposer import EagleProposer
from jaxinfer.speculative.loop import AcceptancePrior, no_prior
from jaxinfer.speculative.proposers import DraftModelProposer, NgramProposer, Proposer
from jaxinfer.speculative.round_plan import CostModel

MIN_PROMPT_BUCKET = 16
NGRAM_COST = 0.02  # token matching on the buffer: small next to any forward pass


class SpeculativeError(ValueError):
    """A draft model that cannot serve this target; the message says why."""


class SpeculativeFallbackWarning(UserWarning):
    """Speculative decoding was switched off; generation continues with plain decoding."""


def decode_flops(cfg: ModelConfig, seq_len: int) -> float:
    """Multiply-adds of one decode token: projections, MLP, attention over seq_len, LM head."""
    d, k = cfg.hidden_size, cfg.head_dim
    per_layer = d * (cfg.num_heads + 2 * cfg.num_kv_heads) * k + cfg.num_heads * k * d
    per_layer += 3 * d * cfg.intermediate_size + 2 * cfg.num_heads * k * seq_len
    return float(cfg.num_layers * per_layer + d * cfg.vocab_size)


def check_vocab(target: ModelConfig, draft: ModelConfig, target_tok: Any, draft_tok: Any, draft_dir: Path) -> None:
    """Raise SpeculativeError unless the draft's ids mean the same tokens as the target's."""
    if draft.vocab_size > target.vocab_size:
        raise SpeculativeError(
            f"draft {draft_dir} has a larger vocabulary ({draft.vocab_size}) than the target "
            f"({target.vocab_size}); the draft must use the target's tokenizer"
        )
    if target_tok is None or draft_tok is None:
        return  # no tokenizer files to compare: ids are taken to be shared
    target_vocab = target_tok.get_vocab()
    for token, index in sorted(draft_tok.get_vocab().items(), key=lambda item: item[1]):
        if target_vocab.get(token) != index:
            raise SpeculativeError(
                f"draft {draft_dir} has a different tokenizer: {token!r} is id {index} in the draft "
                f"and {target_vocab.get(token)} in the target"
            )


def make_proposer(
    config: SpeculativeConfig, target: ModelConfig, target_tok: Any, dtype: Any, max_seq_len: int,
    cpu_kernels: bool = False, layout: Layout = UNSHARDED,
) -> tuple[Proposer, Weights | None]:
    """The proposer for `config` and its parameters (draft weights as they run, see `models.weights_to_run`, or None).

    On a mesh the draft is laid out by the target's rules; dimensions tp does not divide (a
    small draft's heads) stay whole on every device.
    """
    if config.method == "ngram":
        cost = NGRAM_COST if config.draft_cost is None else config.draft_cost
        return NgramProposer(target.vocab_size, config.ngram_min, config.ngram_max, cost), None
    draft_dir = Path(config.draft_model)
    if not draft_dir.is_dir():
        raise SpeculativeError(f"draft model directory {draft_dir} does not exist")
    if config.method == "eagle":
        return make_eagle_proposer(config, target, dtype, max_seq_len, cpu_kernels, layout)
    draft_cfg, draft_weights = load_weights(draft_dir, dtype, progress=False, layout=layout)
    check_vocab(target, draft_cfg, target_tok, load_tokenizer(draft_dir), draft_dir)
    cost = config.draft_cost
    if cost is None:
        cost = decode_flops(draft_cfg, max_seq_len) / decode_flops(target, max_seq_len)
    return DraftModelProposer(draft_cfg, target.vocab_size, cost), weights_to_run(draft_weights, cpu_kernels, False, layout)


def make_eagle_proposer(
    config: SpeculativeConfig, target: ModelConfig, dtype: Any, max_seq_len: int, cpu_kernels: bool, layout: Layout
) -> tuple[EagleProposer, Any]:
    """An EAGLE head's proposer and weights (packed when the CPU kernels are on); a draft step costs
    its layer, fc and LM head in target steps."""
    ecfg, head = load_eagle(config.draft_model, target, dtype, layout)
    cost = config.draft_cost
    if cost is None:
        layer = ecfg.layer
        fc = ecfg.feature_size * layer.hidden_size if ecfg.version == 3 else 2 * layer.hidden_size**2
        vocab = ecfg.draft_vocab if ecfg.version == 3 else layer.vocab_size
        flops = decode_flops(layer, max_seq_len) - layer.hidden_size * (layer.vocab_size - vocab)
        cost = (flops + fc) / decode_flops(target, max_seq_len)
    return EagleProposer(ecfg, config.num_speculative_tokens, cost), pack_eagle(head) if cpu_kernels else head


class SpeculativeDecoder:
    """Runs the speculative loop for LLM and keeps one draft cache and the acceptance totals.

    The draft cache kept is the last batch size's (as the static batch keeps the target's): a
    different batch size drops it and makes its own, so memory stays at one draft cache, and
    `release` frees it.
    """

    def __init__(
        self, config: SpeculativeConfig, proposer: Proposer | None, params: Any, dtype: Any, max_seq_len: int,
        cpu_kernels: bool = False, layout: Layout = UNSHARDED,
    ):
        self.config = config
        self.proposer = proposer
        self.params = params
        self.dtype = dtype
        self.max_seq_len = max_seq_len
        self.cpu_kernels = cpu_kernels  # for the draft caches, as the target's
        self.layout = layout  # likewise
        self.disabled_reason: str | None = None if proposer is not None else "not loaded"
        self.totals = SpecMetrics(config.num_speculative_tokens)
        self._cache: KVCache | None = None  # the draft cache of the last batch size run
        self.costs: dict[int, CostModel] = {}  # per batch bucket, measured on first use
        self._prior: AcceptancePrior | None = None  # what earlier calls learned about acceptance

    @property
    def enabled(self) -> bool:
        """False once speculation was switched off (generation then runs plain)."""
        return self.disabled_reason is None

    def disable(self, reason: str) -> None:
        """Switch speculation off for good, warning why."""
        self.disabled_reason = reason
        warnings.warn(
            f"speculative decoding disabled, continuing with plain decoding: {reason}",
            SpeculativeFallbackWarning,
            stacklevel=3,
        )

    @property
    def feature_layers(self) -> tuple[int, ...] | None:
        """The target features the prefill must hand `decode` (see `features.py`); None: none."""
        return None if self.proposer is None else self.proposer.feature_layers

    def decode(
        self, weights: Weights, cfg: ModelConfig, state: DecodeState, prompt_lengths: list[int],
        features: jax.Array | None = None,
    ) -> tuple[DecodeState, list[dict[str, Any]]] | None:
        """Decode a prefilled batch to the end; None when speculation is (or just got) disabled.

        features: the prompts' target features when `feature_layers` is not None. The whole run,
        up to the results on the host, sits inside the fallback: with asynchronous dispatch a
        run-time failure surfaces only when results are read.
        """
        if not self.enabled:
            return None
        prompt_bucket = min(bucket(max(prompt_lengths), MIN_PROMPT_BUCKET), self.max_seq_len)
        try:
            state, pstate, prior, counters = self._run(weights, cfg, state, prompt_bucket, features)
            host = {name: value for name, value in vars(to_host(counters)).items()}
            jax.block_until_ready((state, pstate, prior))
        except Exception as err:  # noqa: BLE001 - any failure must fall back, never lose the request
            if not self.config.fallback:
                raise
            self.disable(f"the speculative loop failed ({type(err).__name__}: {err})")
            return None
        self._cache = pstate
        self._prior = prior
        rows = len(prompt_lengths)
        self.totals.add(host, rows)
        return state, [request_stats(host, i) for i in range(rows)]

    def _run(
        self, weights: Weights, cfg: ModelConfig, state: DecodeState, bucket: int, features: jax.Array | None
    ) -> tuple:
        """Dispatch proposer prefill, calibration (first use) and the loop; returns its results unread."""
        params = self.proposer.with_target(self.params, weights)
        pstate = self._proposer_state(state.lengths.shape[0])
        if pstate is not None:
            pstate = programs.prefill_proposer(
                params, state, pstate, features, proposer=self.proposer, prompt_bucket=bucket
            )
        costs, state, pstate = self._costs_for(weights, params, cfg, state, pstate)
        prior = self._prior if self._prior is not None else no_prior(self.config)
        return programs.speculative_decode(
            weights, params, state, pstate, prior, costs, cfg=cfg, proposer=self.proposer, spec=self.config
        )

    def metrics(self) -> dict[str, Any]:
        """Acceptance totals since load, and whether (and why not) speculation is on."""
        return {
            "speculative": self.enabled,
            "method": self.config.method,
            "num_speculative_tokens": self.config.num_speculative_tokens,
            "fallback_reason": self.disabled_reason,
            **self.totals.totals(),
        }

    def _costs_for(
        self, weights: Weights, params: Any, cfg: ModelConfig, state: DecodeState, pstate: Any
    ) -> tuple[CostModel, DecodeState, Any]:
        """The round cost model for this batch size (measured once when calibrating, else heuristic), and the state."""
        calibrating = self.config.calibrate
        if calibrating is None:
            calibrating = jax.default_backend() == "cpu"
        if not (self.config.adaptive and calibrating):
            return device_heuristic_costs(self.proposer.draft_cost, self.config), state, pstate
        batch = state.lengths.shape[0]
        if batch not in self.costs:
            self.costs[batch], state, pstate = calibrate(
                programs.speculative_probe, weights, params, state, pstate, cfg, self.proposer, self.config
            )
        return self.costs[batch], state, pstate

    def release(self) -> None:
        """Drop the kept draft cache (the next call makes a new one); weights and totals stay."""
        self._cache = None

    def _proposer_state(self, batch: int) -> Any:
        """The kept draft state when it is for this batch size, else a new one (the old one is dropped)."""
        if not self.proposer.stateful:
            return None
        cache, self._cache = self._cache, None
        if cache is None or is_consumed(cache) or jax.tree.leaves(cache)[0].shape[0] != batch:
            cache = self.proposer.init_state(batch, self.max_seq_len, self.dtype, self.cpu_kernels, self.layout)
        return cache


def build_speculative(
    config: SpeculativeConfig | None, target: ModelConfig, target_tok: Any, dtype: Any, max_seq_len: int,
    cpu_kernels: bool = False, layout: Layout = UNSHARDED,
) -> SpeculativeDecoder | None:
    """A decoder for `config` (None when not speculating); load failures fall back with a warning."""
    if config is None:
        return None
    try:
        proposer, params = make_proposer(config, target, target_tok, dtype, max_seq_len, cpu_kernels, layout)
    except Exception as err:  # noqa: BLE001 - an unusable draft must not stop the target from serving
        if not config.fallback:
            raise
        decoder = SpeculativeDecoder(config, None, None, dtype, max_seq_len)
        decoder.disable(f"{type(err).__name__}: {err}")
        return decoder
    return SpeculativeDecoder(config, proposer, params, dtype, max_seq_len, cpu_kernels, layout)


__all__ = ["SpeculativeDecoder", "SpeculativeError", "SpeculativeFallbackWarning", "build_speculative"]
