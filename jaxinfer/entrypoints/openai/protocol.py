"""Request bodies of the OpenAI API as strict pydantic models, and their mapping to SamplingParams.

Strict types: a string where a number belongs is a 400, not a silent conversion. A field the
server does not implement is a 400 naming it, never ignored: a client that asks for something the
server cannot do must not get plain text back as if it had been honoured. The output-constraint
fields (response_format, structured_outputs, guided_*) and tools are read by structured_fields.py
and tool_calls.py, which name the field in each 400.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.entrypoints.chat_template import message_text

Stop = str | list[str] | None
UNKNOWN_FIELD = "unknown_field"  # the pydantic error type errors.py turns into a 400 naming the field
FUNCTIONS = "the deprecated functions API is not implemented; give tools and tool_choice"
NOT_IMPLEMENTED = {  # fields OpenAI or vLLM define, with what their 400 says is missing
    **dict.fromkeys(("functions", "function_call"), FUNCTIONS),
    "suffix": "insertion (text after the completion) is not implemented",
    "audio": "only text output is implemented", "modalities": "only text output is implemented",
    "prediction": "predicted outputs are not implemented",
}


class StrictBody(BaseModel):
    """A request body (or part of one) whose unknown fields are a 400 naming them."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        for name in data if isinstance(data, dict) else ():
            if name not in cls.model_fields:
                raise PydanticCustomError(UNKNOWN_FIELD, "{message}", {"field": name, "message": unknown_field(cls, name)})
        return data


def unknown_field(model: type[BaseModel], name: str) -> str:
    """Why `name` is refused: what is missing for a field OpenAI or vLLM define, else what is accepted."""
    if name in NOT_IMPLEMENTED:
        return f"{name} is not supported: {NOT_IMPLEMENTED[name]}; leave it out"
    return f"unknown field {name!r}; accepted fields: {', '.join(model.model_fields)}"


class StreamOptions(StrictBody):
    """`stream_options`: include_usage adds a final chunk with token counts."""

    include_usage: bool = False


class SamplingFields(StrictBody):
    """Sampling fields shared by completions and chat (OpenAI's, plus vLLM's extensions)."""

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
    skip_special_tokens: bool = True  # vLLM's: False keeps special tokens (e.g. harmony's markers) in the text
    stop_token_ids: list[int] | None = None
    logit_bias: dict[str, float] | None = None  # OpenAI's JSON keys are token ids as strings
    allowed_token_ids: list[int] | None = None  # vLLM's: sample only these
    bad_words: list[str] | None = None  # vLLM's: never complete one of these words
    truncate_prompt_tokens: int | None = None  # vLLM's: keep the prompt's last k tokens
    priority: int = 0  # vLLM's: lower is served first under --scheduling-policy priority
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    timeout: float | None = None  # seconds (jaxinfer's): past them the request is aborted, a 504
    use_beam_search: bool = False  # vLLM's: the n likeliest continuations (beam_search.py)
    length_penalty: float = 1.0  # ranks beams with use_beam_search
    # Output constraints (at most one; see structured_fields.py): OpenAI's and vLLM's names.
    response_format: dict | None = None
    structured_outputs: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def include_usage(self) -> bool:
        """True when the stream should end with a usage chunk."""
        return self.stream and self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]] | None = None
    prompt_embeds: str | list[str] | None = None  # vLLM's: base64 of torch.save'd [L, hidden] tensors
    logprobs: int | None = None
    echo: bool = False  # the prompt before the completion, and with logprobs the prompt's logprobs
    best_of: int | None = None


class ChatMessage(StrictBody):
    """One message; content is text or a list of text parts; name goes to the chat template."""

    role: str
    content: str | list[dict] | None = None
    name: str | None = None
    tool_calls: list[dict] | None = None  # an assistant's earlier calls, for the chat template
    tool_call_id: str | None = None  # a tool message's answer to that call

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
    continue_final_message: bool = False  # vLLM's: go on with the last (assistant) message
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict | None = None  # vLLM's: more variables for the chat template (e.g. enable_thinking)


class TokenizeRequest(StrictBody):
    """POST /tokenize: a prompt, or chat messages rendered by the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(StrictBody):
    """POST /detokenize."""

    model: str | None = None
    tokens: list[int]


SAMPLING_NAMES = (
    "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
)


def sampling_params(
    request: SamplingFields, defaults: SamplingParams, max_tokens: int, logprobs: int | None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """SamplingParams of a request: its fields where given, the model's defaults elsewhere."""
    given = {name: getattr(request, name) for name in SAMPLING_NAMES if getattr(request, name) is not None}
    if given.get("top_k") == -1:
        given["top_k"] = 0  # vLLM's "off"
    return dataclasses.replace(
        defaults, **given, max_tokens=max_tokens, n=request.n, stop=request.stop or (),
        include_stop_str_in_output=request.include_stop_str_in_output, ignore_eos=request.ignore_eos,
        min_tokens=request.min_tokens, stop_token_ids=tuple(request.stop_token_ids or ()),
        skip_special_tokens=request.skip_special_tokens,
        logit_bias=logit_bias(request.logit_bias), logprobs=logprobs, prompt_logprobs=prompt_logprobs,
        allowed_token_ids=request.allowed_token_ids, bad_words=request.bad_words,
        truncate_prompt_tokens=request.truncate_prompt_tokens,
    )


def logit_bias(value: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's {"token id": bias} with int keys (SamplingParams checks ids and biases)."""
    if value is None:
        return None
    bad = [key for key in value if not re.fullmatch(r"-?[0-9]+", key)]
    if bad:
        raise ValueError(f'logit_bias key {bad[0]!r} is not a token id; give {{"<token id>": bias}}, e.g. {{"50256": -100}}')
    return {int(key): bias for key, bias in value.items()}
