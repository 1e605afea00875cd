"""Request bodies of the OpenAI API as strict pydantic models, and their mapping to SamplingParams.

Strict types: a string where a number belongs is a 400, not a silent conversion. Fields the
API defines but jaxinfer does not implement are accepted only at their neutral value.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from jaxinfer.chat_template import message_text
from jaxinfer.sampling_params import SamplingParams

Stop = str | list[str] | None


class StreamOptions(BaseModel):
    """`stream_options`: include_usage adds a final chunk with token counts."""

    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Sampling fields shared by completions and chat (OpenAI's, plus vLLM's extensions)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = 1
    stop: Stop = None
    include_stop_str_in_output: bool = False
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def include_usage(self) -> bool:
        """True when the stream should end with a usage chunk."""
        return self.stream and self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: Literal[False] = False
    best_of: int | None = None


class ChatMessage(BaseModel):
    """One message; content is text or a list of text parts."""

    model_config = ConfigDict(strict=True, extra="ignore")
    role: str
    content: str | list[dict] | None = None

    def text(self) -> str:
        """The message's text (text parts joined; other part types are a ValueError)."""
        return message_text(self.content, "messages content")


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True


class TokenizeRequest(BaseModel):
    """POST /tokenize: a prompt, or chat messages rendered by the chat template."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    """POST /detokenize."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: str | None = None
    tokens: list[int]


SAMPLING_NAMES = (
    "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
)


def sampling_params(
    request: SamplingFields, defaults: SamplingParams, max_tokens: int, logprobs: int | None
) -> SamplingParams:
    """SamplingParams of a request: its fields where given, the model's defaults elsewhere."""
    given = {name: getattr(request, name) for name in SAMPLING_NAMES if getattr(request, name) is not None}
    if given.get("top_k") == -1:
        given["top_k"] = 0  # vLLM's "off"
    return dataclasses.replace(
        defaults, **given, max_tokens=max_tokens, n=request.n, stop=request.stop or (),
        include_stop_str_in_output=request.include_stop_str_in_output, ignore_eos=request.ignore_eos,
        min_tokens=request.min_tokens,
        stop_token_ids=tuple(request.stop_token_ids or ()), logprobs=logprobs, prompt_logprobs=None,
    )
