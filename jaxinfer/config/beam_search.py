"""Beam search's parameters (vLLM's `BeamSearchParams`), validated on construction."""

from __future__ import annotations

import dataclasses

from jaxinfer.config import validation as v
from jaxinfer.config.sampling_params import MAX_LOGPROBS

# Each beam's candidates are its step's top 2 x beam_width tokens, read from the step's logprobs.
MAX_BEAM_WIDTH = MAX_LOGPROBS // 2


@dataclasses.dataclass(frozen=True)
class BeamSearchParams:
    """How `LLM.beam_search` searches: `beam_width` sequences kept per prompt, up to `max_tokens` new
    tokens each.

    Sequences are ranked by their summed log-probability over the generated tokens divided by
    (generated tokens ** length_penalty), as HF transformers ranks finished hypotheses: above 1
    favours longer ones, below 1 shorter ones. A beam that reaches an EOS id is finished (unless
    ignore_eos). temperature is the one-token steps' sampling temperature, as vLLM's: 0 (the
    default) ranks exactly the model's most likely continuations; above 0 a sampled token joins
    each beam's candidates.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        hint = f"each beam reads its top 2 x beam_width candidates from at most {MAX_LOGPROBS} logprobs"
        self._set("beam_width", v.positive_int(self.beam_width, "beam_width", MAX_BEAM_WIDTH, hint))
        self._set("max_tokens", v.positive_int(self.max_tokens, "max_tokens"))
        self._set("ignore_eos", v.boolean(self.ignore_eos, "ignore_eos"))
        self._set("temperature", v.number(self.temperature, "temperature", low=0, hint="0 ranks the likeliest"))
        self._set("length_penalty", v.number(self.length_penalty, "length_penalty", -10, 10))

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
