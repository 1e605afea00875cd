"""A chat request's `image_url` content parts (OpenAI's and vLLM's format): read, checked against the
served model, and turned into the placeholder text its template renders and the images the engine
carries (entrypoints/multimodal). A model without a vision tower refuses them with a 400 naming the part."""

from __future__ import annotations

from typing import Any

from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.protocol import ChatMessage
from jaxinfer.entrypoints.openai.serving import ServerState


def take_images(state: ServerState, messages: list[ChatMessage], typed: bool = False
                ) -> tuple[list[ChatMessage], list[Any]]:
    """The messages with image parts as placeholder text (typed: as image parts the template marks), and their
    images in order."""
    if state.image_prompts is None or not any(isinstance(m.content, list) for m in messages):
        return messages, []
    try:
        contents, images = state.image_prompts.chat_images([m.content for m in messages], "messages", typed)
    except ValueError as error:
        raise APIError(str(error), param="messages") from None
    return [m.model_copy(update={"content": c}) for m, c in zip(messages, contents)], images


def with_images(state: ServerState, ids: list[int], images: list[Any]) -> tuple[list[int], tuple]:
    """(ids with each image's placeholders expanded, the images as the engine carries them)."""
    if not images:
        return ids, ()
    try:
        return state.image_prompts.prompt(ids, images, "messages")
    except ValueError as error:
        raise APIError(str(error), param="messages") from None
