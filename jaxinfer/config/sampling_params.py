"""User-facing sampling parameters (host side, validated on construction)."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from jaxinfer.config import validation as v
from jaxinfer.config.structured_outputs import StructuredOutputsParams

TOP_K_LIMIT = 2**31 - 1  # top_k lives in an int32 array
MAX_LOGPROBS = 20
MAX_N = 64
# Every step program takes this many (token id, bias) slots per row, used or not, so a request's
# logit_bias is data, never a new compiled variant.
MAX_LOGIT_BIAS = 300
# Stop token ids (EOS and stop_token_ids) every step program takes per row, for the same reason.
# The host checks every stop id of a request; the device needs them to mask stop ids before
# min_tokens (so more than this with min_tokens > 0 is refused) and to end multi-step calls early.
MAX_STOP_IDS = 32
LOGIT_BIAS_RANGE = 100.0  # OpenAI's: -100 bans a token, 100 all but forces it


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request; defaults follow vLLM (temperature 1, no filtering).

    temperature 0 means greedy. top_k 0 (or -1) and top_p 1 disable those filters; min_p keeps
    tokens whose probability is at least min_p times the most likely one's. The same seed gives
    the same output whatever else is in the batch. Penalties follow vLLM: presence and frequency
    subtract from the logits of tokens already generated; repetition divides positive (multiplies
    negative) logits of tokens in the prompt or output. `stop` strings end generation and are
    not part of the text unless include_stop_str_in_output; `logprobs=k` returns the top-k
    log-probabilities of each generated token (and `prompt_logprobs=k` of each prompt token);
    `n` samples share the prompt. `logit_bias` ({token id: bias in [-100, 100]}, OpenAI's) is
    added to those tokens' logits before penalties and sampling; logprobs stay the model's.
    `structured_outputs` constrains the output to a JSON schema, regex, choice or grammar (the
    `structured` extra); logprobs stay the model's there too. `skip_special_tokens` (vLLM's, default
    True) leaves special tokens out of the text; False keeps them, as markers a parser reads (GPT-OSS's).
    vLLM's `allowed_token_ids` samples only those ids (the end-of-sequence ids too only when listed);
    `bad_words` never completes one of those words (each tokenized as written and after a space: its last
    token is banned where the output ends with the rest). `truncate_prompt_tokens=k` keeps a prompt's last
    k tokens (-1: as many as the context takes with max_tokens).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | Sequence[str] = ()
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    n: int = 1
    logit_bias: Mapping[int, float] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    skip_special_tokens: bool = True
    allowed_token_ids: Sequence[int] | None = None
    bad_words: Sequence[str] | None = None
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        self._set("max_tokens", v.positive_int(self.max_tokens, "max_tokens"))
        self._set("temperature", v.number(self.temperature, "temperature", low=0, hint="use 0 for greedy"))
        top_k = v.integer(self.top_k, "top_k", -1, TOP_K_LIMIT, hint="0 or -1 disables it")
        self._set("top_k", max(top_k, 0))
        self._set("top_p", v.number(self.top_p, "top_p"))
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}; use 1.0 to disable nucleus sampling")
        self._set("min_p", v.number(self.min_p, "min_p", 0, 1))
        self._set("seed", v.optional_int(self.seed, "seed", 0, 2**63 - 1))
        self._set("stop_token_ids", tuple(_stop_token_ids(self.stop_token_ids)))
        self._set("ignore_eos", v.boolean(self.ignore_eos, "ignore_eos"))
        for name in ("presence_penalty", "frequency_penalty"):
            self._set(name, v.number(getattr(self, name), name, -2, 2))
        self._set("repetition_penalty", v.number(self.repetition_penalty, "repetition_penalty"))
        if not 0 < self.repetition_penalty <= 10:
            raise ValueError(f"repetition_penalty must be in (0, 10] (1 disables it), got {self.repetition_penalty}")
        self._set("stop", _stop_strings(self.stop))
        include = v.boolean(self.include_stop_str_in_output, "include_stop_str_in_output")
        self._set("include_stop_str_in_output", include)
        self._set("min_tokens", v.integer(self.min_tokens, "min_tokens", 0, self.max_tokens))
        for name in ("logprobs", "prompt_logprobs"):
            self._set(name, v.optional_int(getattr(self, name), name, 0, MAX_LOGPROBS))
        self._set("n", v.integer(self.n, "n", 1, MAX_N))
        self._set("logit_bias", _logit_bias(self.logit_bias))
        self._set("skip_special_tokens", v.boolean(self.skip_special_tokens, "skip_special_tokens"))
        if self.allowed_token_ids is not None:
            allowed = tuple(dict.fromkeys(v.token_ids(self.allowed_token_ids, "allowed_token_ids")))
            if not allowed:
                raise ValueError("allowed_token_ids is empty: give at least one token id (or None for any)")
            self._set("allowed_token_ids", allowed)
        self._set("bad_words", _bad_words(self.bad_words))
        truncate = v.optional_int(self.truncate_prompt_tokens, "truncate_prompt_tokens", -1, v.INT32_LIMIT)
        self._set("truncate_prompt_tokens", truncate)
        if truncate == 0:
            raise ValueError("truncate_prompt_tokens must be >= 1 (the last k prompt tokens) or -1, got 0")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise TypeError("structured_outputs must be a StructuredOutputsParams or None, got "
                            f"{type(self.structured_outputs).__name__}")

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        """True when tokens are chosen by argmax."""
        return self.temperature == 0

    def stop_ids(self, eos_token_ids: Sequence[int]) -> tuple[int, ...]:
        """The ids that end this request: the model's EOS ids (unless ignore_eos), then stop_token_ids, once each."""
        eos = () if self.ignore_eos else tuple(eos_token_ids)
        return tuple(dict.fromkeys(eos + tuple(self.stop_token_ids)))

    def kept_prompt(self, ids: list[int], max_seq_len: int) -> list[int]:
        """The prompt ids the request keeps: the last truncate_prompt_tokens (-1: as many as fit beside
        max_tokens), else all."""
        keep = self.truncate_prompt_tokens
        if keep is None:
            return ids
        return ids[-(max(max_seq_len - self.max_tokens, 1) if keep == -1 else keep):]

    @property
    def filters_tokens(self) -> bool:
        """True when allowed_token_ids or bad_words take tokens away (a mask every step, as a constraint's)."""
        return self.allowed_token_ids is not None or bool(self.bad_words)

    @property
    def penalized(self) -> bool:
        """True when any penalty changes the logits."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)


def _stop_token_ids(value: object) -> list[int]:
    """Stop ids as ints in int32 range; whether they are in the vocabulary is checked by the LLM."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"stop_token_ids must be a list of int token ids, got {value!r}; use stop=[...] for strings")
    strings = [i for i, t in enumerate(value) if isinstance(t, str)] if isinstance(value, (list, tuple)) else []
    if strings:
        i = strings[0]
        raise TypeError(f"stop_token_ids[{i}] must be an int token id, got {value[i]!r}; use stop=[...] for strings")
    return v.token_ids(value, "stop_token_ids")


def _stop_strings(value: object) -> tuple[str, ...]:
    """One stop string or a list of them, none empty."""
    stops = (value,) if isinstance(value, str) else value
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise TypeError(f"stop must be a non-empty string or a list of them, got {value!r}")
    return tuple(stops)


def _bad_words(value: object) -> tuple[str, ...] | None:
    """A list of non-empty words (strings); None when empty."""
    if value is None:
        return None
    words = value if isinstance(value, (list, tuple)) else None
    if words is None or not all(isinstance(w, str) and w.strip() for w in words):
        raise TypeError(f"bad_words must be a list of non-empty strings, got {value!r}")
    return tuple(words) or None


def _logit_bias(value: object) -> dict[int, float] | None:
    """{token id: bias} with ids in int32 range (the vocabulary is checked by the LLM) and biases
    in [-100, 100]; None when empty, so an empty dict runs like no bias at all."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"logit_bias must be a dict {{token id: bias}}, got {type(value).__name__}")
    if len(value) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias has {len(value)} token ids; at most {MAX_LOGIT_BIAS} are accepted")
    bias = {}
    for token, amount in value.items():
        token = v.integer(token, "logit_bias key", 0, v.INT32_LIMIT - 1, hint="keys are int token ids")
        bias[token] = v.number(amount, f"logit_bias value of token {token}", -LOGIT_BIAS_RANGE, LOGIT_BIAS_RANGE)
    return bias or None
