"""Beam search's bookkeeping for one prompt (no jax): beams extended by their step's candidate
tokens, the likeliest kept running, finished ones ranked by length-normalised log-probability."""

from __future__ import annotations

import dataclasses
from typing import Callable, Collection, Generator, Sequence

from jaxinfer.config.beam_search import BeamSearchParams
from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.outputs import RequestOutput
from jaxinfer.sampling.logprob import Logprob


@dataclasses.dataclass
class BeamSearchSequence:
    """One beam, as vLLM's: `tokens` are the prompt's ids then the generated ones; `logprobs` one
    dict per generated token (the candidates its step read); `text` the generated text without a
    final EOS, set when the search ends."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = dataclasses.field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" at an EOS id, "length" at max_tokens
    lora_request: LoRARequest | None = None
    images: tuple = ()  # the prompt's images (ImageInputs over their placeholders), run with every step


@dataclasses.dataclass
class BeamSearchOutput:
    """One prompt's best sequences, best first (vLLM's)."""

    sequences: list[BeamSearchSequence]


def beam_score(cum_logprob: float, generated: int, length_penalty: float) -> float:
    """HF transformers' ranking of finished hypotheses: summed log-probability / length ** penalty."""
    return cum_logprob / generated**length_penalty


class PromptBeams:
    """One prompt's search: up to beam_width `running` beams, likeliest first, and the best `finished`."""

    def __init__(self, prompt_ids: Sequence[int], params: BeamSearchParams, eos_ids: Collection[int],
                 lora_request: LoRARequest | None = None, images: tuple = ()):
        self.params = params
        self.prompt_len = len(prompt_ids)
        self.eos = frozenset() if params.ignore_eos else frozenset(eos_ids)
        self.running = [BeamSearchSequence(list(prompt_ids), lora_request=lora_request, images=images)]
        self.finished: list[BeamSearchSequence] = []
        self.generated = 0

    @property
    def done(self) -> bool:
        """No beam runs, or none can still rank among the beam_width best finished ones."""
        if not self.running:
            return True
        if len(self.finished) < self.params.beam_width:
            return False
        return self._best_reachable() <= self._score(self.finished[-1])

    def advance(self, candidates: Sequence[dict[int, Logprob]]) -> None:
        """One step: each running beam (in order) extended by each of its candidate tokens; those ending
        at an EOS id finish, the beam_width likeliest of the others run on (or finish at max_tokens)."""
        self.generated += 1
        extended = []
        for beam, step in zip(self.running, candidates, strict=True):
            for token, logprob in step.items():
                child = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [step],
                                           beam.cum_logprob + logprob.logprob, lora_request=beam.lora_request,
                                           images=beam.images)
                if token in self.eos:
                    child.finish_reason = "stop"
                    self.finished.append(child)
                else:
                    extended.append(child)
        extended.sort(key=lambda beam: beam.cum_logprob, reverse=True)  # all one length: the score's order
        self.running = extended[: self.params.beam_width]
        if self.generated == self.params.max_tokens:
            for beam in self.running:
                beam.finish_reason = "length"
            self.finished += self.running
            self.running = []
        self.finished = sorted(self.finished, key=self._score, reverse=True)[: self.params.beam_width]

    def best(self, decode: Callable[[list[int]], str]) -> list[BeamSearchSequence]:
        """The finished sequences, best first, each with its generated text (a final EOS left out)."""
        for beam in self.finished:
            generated = beam.tokens[self.prompt_len:]
            beam.text = decode(generated[:-1] if beam.finish_reason == "stop" else generated)
        return self.finished

    def _score(self, beam: BeamSearchSequence) -> float:
        return beam_score(beam.cum_logprob, len(beam.tokens) - self.prompt_len, self.params.length_penalty)

    def _best_reachable(self) -> float:
        """An upper bound on any running beam's final score: log-probabilities only fall, so the best
        beam's sum over the length that divides it most (max_tokens when length_penalty > 0, else the
        next token's)."""
        length = self.params.max_tokens if self.params.length_penalty > 0 else self.generated + 1
        return beam_score(self.running[0].cum_logprob, length, self.params.length_penalty)


Steps = Generator[list[BeamSearchSequence], list[dict[int, Logprob]], None]


def search_steps(searches: Sequence[PromptBeams]) -> Steps:
    """Drives several searches a step at a time: yields the live beams of them all (each to be run for
    one token), and is sent each beam's candidates back, in the same order; ends when all are done."""
    while live := [search for search in searches if not search.done]:
        candidates = iter((yield [beam for search in live for beam in search.running]))
        for search in live:
            search.advance([next(candidates) for _ in search.running])


def step_params(params: BeamSearchParams) -> SamplingParams:
    """What each beam's one-token request asks: its top 2 x beam_width logprobs (the candidates)."""
    return SamplingParams(max_tokens=1, temperature=params.temperature, logprobs=2 * params.beam_width,
                          ignore_eos=True)


def candidates_of(outputs: Sequence[RequestOutput]) -> list[dict[int, Logprob]]:
    """The candidates each one-token request read, in order."""
    return [output.outputs[0].logprobs[0] for output in outputs]
