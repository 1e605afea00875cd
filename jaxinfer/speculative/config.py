"""User-facing speculative decoding settings (host side, validated on construction)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

METHODS = ("draft", "ngram", "eagle", "suffix", "ngram_device", "mtp")
ALIASES = {"deepseek_mtp": "mtp"}  # vLLM's other name for a model's own MTP layers
HOST_METHODS = ("ngram", "suffix")  # drafted on the host from the tokens; no second model
MODEL_FREE = (*HOST_METHODS, "ngram_device")  # no draft_model to give


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """How to speculate; hashable (its acceptance rule is a static argument of the verify program).

    method "draft" runs `draft_model` (a checkpoint directory sharing the target's tokenizer) k
    steps per target pass; "eagle" runs an EAGLE-1 or EAGLE-3 head (`draft_model` is its HF
    directory) over the target's hidden states; both draft on the device inside the engine's
    verify step; "ngram" proposes
    what followed the latest earlier occurrence of the last n tokens (ngram_max down to ngram_min)
    in the prompt and output, with no second model, on the host (one verify round per call: it
    needs the tokens the call produced); "ngram_device" the same lookup on the device inside the
    verify step, from a pool of every position's token, so one call runs several rounds as a draft
    model's does; "mtp" (alias "deepseek_mtp") runs the target's own multi-token-prediction layer
    (DeepSeek-V3, GLM-4.5: `num_nextn_predict_layers`; no draft_model) as an EAGLE head runs, or with
    a draft_model a Gemma 4 assistant (Gemma4AssistantForCausalLM) over the target's K/V, as vLLM does;
    "suffix" (suffix decoding, vLLM's name)
    proposes the most frequent continuation of the longest-matching suffixes in the request's
    prompt and output and in recent requests' outputs (`jaxinfer.engine.suffix_cache`), as many
    tokens as the counts make likely: up to num_speculative_tokens, suffix_max_spec_factor x the
    match length, while the path's empirical probability stays >= suffix_min_token_prob.
    num_speculative_tokens is k_max, fixed per compiled program. With adaptive=True each sequence
    picks its own k <= k_max from a moving average of its acceptance and a cost model, and stops
    speculating when the expected gain drops below 1. The engine times its own plain and verify
    steps as it runs, on every platform, and plans with those times once both are known (the
    heuristic of draft_cost and verify_saturation_tokens until then); calibrate=False keeps the
    heuristic.
    With fallback=True a draft that cannot be used only warns and generation runs plain.
    """

    method: str = "draft"
    draft_model: str | None = None
    num_speculative_tokens: int = 4
    adaptive: bool = True
    calibrate: bool = True  # False: plan with the heuristic only
    ngram_min: int = 1
    ngram_max: int = 3
    # Suffix decoding (vLLM's suffix_decoding_* knobs): the longest substring counted (match plus
    # draft; vLLM's 24 costs this Python trie ~1.5x the time and memory per token of 16), the most
    # finished outputs (and their tokens; ~3 KB each at depth 16) kept for later requests, and the
    # draft's bounds.
    suffix_max_depth: int = 16
    suffix_max_cached_requests: int = 1000
    suffix_max_cached_tokens: int = 50_000
    suffix_max_spec_factor: float = 1.0
    suffix_min_token_prob: float = 0.1
    # Cost of one draft step relative to one target step; None estimates it from FLOPs.
    draft_cost: float | None = None
    # Tokens per target forward beyond which each extra verified token costs as much as a
    # whole decode step (the forward becomes compute bound); large batches hit it first.
    verify_saturation_tokens: int = 256
    acceptance_decay: float = 0.7
    # Expected speedup a sequence must show before it drafts: the margin absorbs noise in the
    # measured costs and acceptance estimates (1.0 speculates on any expected gain).
    min_gain: float = 1.1
    initial_acceptance: float = 0.8
    fallback: bool = True
    # The acceptance rule (a `rejection.AcceptanceRule`; None: the exact one, `acceptance_rule`);
    # only tests set one (broken rules that must be caught). Kept untyped: this module loads no jax.
    rule: Any = None

    @property
    def acceptance_rule(self) -> Any:
        """The rejection sampler's rule: `rule`, else the exact rule."""
        from jaxinfer.speculative.rejection import EXACT_RULE

        return EXACT_RULE if self.rule is None else self.rule

    @property
    def drafts_on_host(self) -> bool:
        """True for the methods that draft from the tokens on the host (n-gram, suffix): no draft model."""
        return self.method in HOST_METHODS

    @property
    def model_free(self) -> bool:
        """True for the methods with no second model (n-gram on the host or device, suffix): the host's
        lookup finds what a row can draft, so the plan knows it before a verify call."""
        return self.method in MODEL_FREE

    @property
    def looks_up_on_device(self) -> bool:
        """True for "ngram_device": each verify round looks its drafts up on the device, from a pool
        of every position's token that every step writes."""
        return self.method == "ngram_device"

    @property
    def reads_target_kv(self) -> bool:
        """True for a Gemma 4 assistant (method "mtp" with a draft_model): it attends to the target's K/V."""
        return self.method == "mtp" and self.draft_model is not None

    @property
    def catches_up(self) -> bool:
        """True for a draft model, EAGLE head or MTP layer: they skip plain decode calls (reading them would cost a
        forward a step while speculation is off) and read the positions they missed before drafting. A Gemma 4
        assistant keeps only the target's states, which every step stores: nothing to catch up."""
        return self.method in ("draft", "eagle", "mtp") and not self.reads_target_kv

    def __post_init__(self) -> None:
        if isinstance(self.draft_model, Path):
            object.__setattr__(self, "draft_model", str(self.draft_model))
        object.__setattr__(self, "method", ALIASES.get(self.method, self.method))
        _check(self.method in METHODS,
               f"method must be one of {', '.join((*METHODS, *ALIASES))}, got {self.method!r}")
        _check(
            self.method != "draft" or self.draft_model is not None,
            'method="draft" needs draft_model=<checkpoint directory>; use method="ngram" for no second model',
        )
        _check(
            self.method != "eagle" or self.draft_model is not None,
            'method="eagle" needs draft_model=<EAGLE head directory> (HF layout: config.json + safetensors)',
        )
        _check(
            1 <= self.num_speculative_tokens <= 32,
            f"num_speculative_tokens must be in [1, 32], got {self.num_speculative_tokens}",
        )
        _check(
            1 <= self.ngram_min <= self.ngram_max,
            f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}",
        )
        _check(self.suffix_max_depth >= 1, f"suffix_max_depth must be >= 1, got {self.suffix_max_depth}")
        _check(
            self.suffix_max_cached_requests >= 0 and self.suffix_max_cached_tokens >= 0,
            "suffix_max_cached_requests and suffix_max_cached_tokens must be >= 0 (0 keeps no outputs)",
        )
        _check(self.suffix_max_spec_factor > 0, f"suffix_max_spec_factor must be > 0, got {self.suffix_max_spec_factor}")
        _check(
            0 <= self.suffix_min_token_prob <= 1,
            f"suffix_min_token_prob must be in [0, 1], got {self.suffix_min_token_prob}",
        )
        _check(self.draft_cost is None or self.draft_cost >= 0, f"draft_cost must be >= 0, got {self.draft_cost}")
        _check(self.verify_saturation_tokens >= 1, "verify_saturation_tokens must be >= 1")
        _check(self.min_gain >= 1.0, f"min_gain must be >= 1, got {self.min_gain}")
        _check(0 <= self.acceptance_decay < 1, f"acceptance_decay must be in [0, 1), got {self.acceptance_decay}")
        _check(
            0 < self.initial_acceptance < 1, f"initial_acceptance must be in (0, 1), got {self.initial_acceptance}"
        )


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
