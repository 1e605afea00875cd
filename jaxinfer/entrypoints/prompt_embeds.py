"""Prompt embeddings as input (vLLM's `prompt_embeds`): a [L, hidden_size] tensor in place of a prompt's
token ids, for models started with `enable_prompt_embeds=True` (soft prompts, another encoder's output).

The prompt becomes L placeholder ids (`PLACEHOLDER_ID`) whose embeddings the tensor's rows replace, as
an image's placeholders take its features (runtime/image_input: one `ImageInput.given` over the whole
prompt); generated tokens are embedded as usual. The rows are the embedding layer's output (after
Gemma's sqrt(hidden) scale, as HF's `inputs_embeds`). A prompt_embeds dict holds that key alone;
the server takes `torch.save` bytes in base64 (`decode_base64`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxinfer.config import validation
from jaxinfer.config.model import ConfigError
from jaxinfer.runtime.image_input import ImageInput

PLACEHOLDER_ID = 0  # the prompt's ids where rows are given: never embedded, never penalized


@dataclasses.dataclass(frozen=True)
class PromptEmbeds:
    """Whether a model takes prompt_embeds (`enable_prompt_embeds`) and the width of their rows."""

    enabled: bool
    hidden_size: int

    def prompt(self, value: Any, field: str) -> tuple[list[int], tuple[ImageInput, ...]]:
        """(placeholder ids, the rows as the engine carries them) of one [L, hidden_size] tensor; errors name field."""
        if not self.enabled:
            raise ValueError(f"{field}: prompt_embeds needs a model started with enable_prompt_embeds=True "
                             "(the server's --enable-prompt-embeds)")
        rows = as_rows(value, self.hidden_size, field)
        return [PLACEHOLDER_ID] * len(rows), (ImageInput.given(rows),)

    def dict_prompt(self, prompt: Mapping[str, Any], field: str) -> tuple[list[int], tuple[ImageInput, ...]]:
        """A vLLM EmbedsPrompt dict ({"prompt_embeds": tensor}); other keys beside it are refused by name."""
        others = sorted(set(prompt) - {"prompt_embeds"})
        if others:
            raise ValueError(f"{field}: a prompt_embeds prompt takes no {others} beside it (the embeddings are the "
                             "whole prompt; images, text and token ids go in prompts of their own)")
        return self.prompt(prompt["prompt_embeds"], f"{field}.prompt_embeds")


def enabled_setting(enable_prompt_embeds: Any, speculative: Any) -> bool:
    """`enable_prompt_embeds` checked: a bool, and not with speculative decoding (drafts read the prompt's ids,
    which are placeholders here)."""
    enabled = validation.boolean(enable_prompt_embeds, "enable_prompt_embeds")
    if enabled and speculative is not None:
        raise ConfigError("enable_prompt_embeds=True with speculative decoding is not supported (drafters read the "
                          "prompt's token ids, which prompt_embeds do not have); start without speculative")
    return enabled


def as_rows(value: Any, hidden_size: int, field: str) -> np.ndarray:
    """[L, hidden_size] float32 of a torch, NumPy or jax tensor of a floating dtype; TypeError/ValueError naming
    the field, the value's shape or dtype and what is accepted."""
    if type(value).__module__.startswith("torch"):
        if not value.dtype.is_floating_point:
            raise TypeError(f"{field}: dtype {value.dtype} is not floating; give float32, float16 or bfloat16")
        value = value.detach().cpu().float().numpy()  # NumPy has no bfloat16
    elif not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise TypeError(f"{field} must be a torch, NumPy or jax tensor [sequence_length, hidden_size], "
                        f"got {type(value).__name__}")
    dtype = np.dtype(value.dtype)
    if dtype.kind != "f" and dtype.name != "bfloat16":
        raise TypeError(f"{field}: dtype {dtype} is not floating; give float32, float16 or bfloat16")
    if len(value.shape) != 2:
        raise ValueError(f"{field} must be [sequence_length, hidden_size] (rank 2), got shape {tuple(value.shape)}")
    if value.shape[0] == 0:
        raise ValueError(f"{field} is empty (shape {tuple(value.shape)}); give at least one row")
    if value.shape[1] != hidden_size:
        raise ValueError(f"{field}: rows of {value.shape[1]} values, the model's hidden_size is {hidden_size}")
    return np.asarray(value, np.float32)


def decode_base64(text: str, field: str) -> Any:
    """The tensor vLLM's clients send: `torch.save` bytes in base64 (read with weights_only: tensors only)."""
    try:
        import torch
    except ImportError:
        raise ValueError(f"{field}: reading torch.save'd tensors needs torch (pip install torch)") from None
    try:
        data = base64.b64decode(text, validate=True)
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except (binascii.Error, pickle.UnpicklingError, ValueError, RuntimeError, EOFError, TypeError) as error:
        raise ValueError(f"{field}: not base64 of a torch.save'd tensor ({type(error).__name__}: {error})") from None
