"""vLLM's typed prompt dicts (`from vllm import TextPrompt, TokensPrompt`), so code that builds its prompts
with them runs as written: `LLM.generate`, `stream` and `beam_search` read these keys from any dict."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class TextPrompt(TypedDict):
    """A prompt as text; `multi_modal_data` {"image": ...} for a vision-language model (docs/multimodal.md)."""

    prompt: str
    multi_modal_data: NotRequired[dict[str, Any]]


class TokensPrompt(TypedDict):
    """A prompt as token ids; `multi_modal_data` as TextPrompt's."""

    prompt_token_ids: list[int]
    multi_modal_data: NotRequired[dict[str, Any]]
