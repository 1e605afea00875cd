"""A prompt's audio as the engine carries it (plain data, no jax): an encoder-decoder model's (Whisper's)
log-mel features, made by the facade's feature extractor (entrypoints/audio_prompts). It travels with the
prompt's images (`LLMEngine.add_request(images=...)`, one `AudioInput` at most) and stays with the request
(`Request.audio`), so a preempted request's encoder runs again from it (runtime/audio_runner)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class AudioInput:
    """One prompt's log-mel features [mel bins, frames] float32, as the model's feature extractor made them."""

    features: np.ndarray = dataclasses.field(repr=False)


def split_audio(inputs: Sequence[Any]) -> tuple[np.ndarray | None, tuple[Any, ...]]:
    """(the features of the one AudioInput among a prompt's inputs, or None; the other inputs: its images)."""
    audio = [i for i in inputs if isinstance(i, AudioInput)]
    if len(audio) > 1:
        raise ValueError(f"multi_modal_data.audio: one audio clip per prompt is served, got {len(audio)}")
    rest = tuple(i for i in inputs if not isinstance(i, AudioInput))
    return (audio[0].features if audio else None), rest
