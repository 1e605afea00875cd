"""Request checks before anything is queued: clear errors that name the field (host side, no jax)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from jaxinfer.config.model import ModelConfig
from jaxinfer.config.sampling_params import MAX_STOP_IDS, SamplingParams
from jaxinfer.runtime.image_input import ImageInput


def encode_prompt(prompt: str | Sequence[int], tokenizer: Any | None) -> list[int]:
    """Token ids of a prompt: text through the tokenizer, or a list of ints as given."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("prompt is text but the model has no tokenizer files; pass token ids instead")
        return list(tokenizer.encode(prompt, verbose=False))
    if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence | np.ndarray):
        raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")
    bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, int | np.integer)]
    if bad:
        raise TypeError(f"prompt token ids must be integers, got {bad[0]!r} ({type(bad[0]).__name__})")
    return [int(t) for t in prompt]


def check_prompt(ids: list[int], max_tokens: int, vocab_size: int, max_seq_len: int) -> None:
    """Raise ValueError for an empty, too long or out-of-vocabulary prompt."""
    if not ids:
        raise ValueError("prompt is empty; give at least one token")
    if len(ids) + max_tokens > max_seq_len:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds max_seq_len "
            f"{max_seq_len}; shorten the prompt, lower max_tokens or raise max_seq_len"
        )
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")


def check_priority(priority: object, policy: str) -> int:
    """The request's priority, or an error naming it: an integer, and other than 0 only under the "priority"
    scheduling policy (vLLM refuses it under "fcfs" too, where it would be silently ignored)."""
    if isinstance(priority, bool) or not isinstance(priority, int | np.integer):
        raise TypeError(f"priority must be an integer (lower is served first), got {priority!r}")
    if priority and policy != "priority":
        raise ValueError(f"priority={priority} needs scheduling_policy='priority' (LLM(..., scheduling_policy="
                         f"'priority') or `jaxinfer serve --scheduling-policy priority`); under {policy!r} every "
                         "request has priority 0")
    return int(priority)


def check_logit_bias(bias: Mapping[int, float] | None, vocab_size: int) -> None:
    """Raise ValueError for logit_bias token ids outside the vocabulary (SamplingParams checked the rest)."""
    bad = sorted(t for t in bias or () if t >= vocab_size)
    if bad:
        raise ValueError(f"logit_bias has token ids {bad[:5]} outside the vocabulary [0, {vocab_size})")


def check_stop_ids(stop_ids: Sequence[int], min_tokens: int) -> None:
    """Raise ValueError when min_tokens must hold back more stop ids than the device masks."""
    if min_tokens > 0 and len(stop_ids) > MAX_STOP_IDS:
        raise ValueError(
            f"min_tokens={min_tokens} with {len(stop_ids)} stop token ids (EOS included): at most {MAX_STOP_IDS} "
            "can be held back until min_tokens; pass fewer stop_token_ids (or ignore_eos=True) or min_tokens=0"
        )


def check_audio(model_config: ModelConfig, audio: object | None, params: SamplingParams) -> None:
    """ValueError naming what an encoder-decoder model's request lacks, or a decoder-only one cannot take."""
    arch = model_config.architecture
    if not model_config.encoder_frames:
        if audio is not None:
            raise ValueError(f"multi_modal_data.audio: {arch} takes no audio (it has no audio encoder)")
        return
    if audio is None:
        raise ValueError(f"multi_modal_data.audio: {arch} transcribes audio; give each prompt "
                         "{'prompt': ..., 'multi_modal_data': {'audio': (samples, sample_rate)}}")
    if params.prompt_logprobs is not None:
        raise ValueError(f"prompt_logprobs is not served for {arch} (its cross-attention runs in the engine's "
                         "steps only); leave it unset")


def check_images(images: Sequence[ImageInput], ids: list[int], params: SamplingParams, vision: Any,
                 prompt_embeds: bool, whole_images: bool, max_batched: int) -> tuple[ImageInput, ...]:
    """The images as a request carries them; ValueError naming what a model or request cannot take.

    vision: the runner's vision tower (None: the model takes no images); prompt_embeds: the engine serves
    prompt_embeds prompts; whole_images: an image's tokens attend both ways, so one prefill chunk holds it."""
    images = tuple(images)
    if any(image.rows is not None for image in images):
        return _checked_embeds(images, params, prompt_embeds)
    if not images:
        return images
    if vision is None:
        raise ValueError("multi_modal_data: this model takes no images (it has no vision tower); send text only")
    if params.prompt_logprobs is not None and vision.bidirectional:
        raise ValueError("prompt_logprobs is not served with images on this model yet (its image tokens see "
                         "each other both ways, which the all-positions pass does not do); leave it unset")
    for image in images:
        if not 0 <= image.offset <= image.offset + image.length <= len(ids):
            raise ValueError(f"multi_modal_data: an image's placeholders [{image.offset}, "
                             f"{image.offset + image.length}) fall outside the {len(ids)}-token prompt")
        if whole_images and image.length > max_batched:
            raise ValueError(f"multi_modal_data: an image takes {image.length} tokens, more than "
                             f"max_num_batched_tokens {max_batched}, and this model's image tokens attend to each "
                             "other both ways (one prefill chunk holds a whole image); raise max_num_batched_tokens")
    return images


def check_whole_prompt(ids: list[int], params: SamplingParams, max_batched: int) -> None:
    """ValueError naming what a prompt that is one bidirectional prefix (PaliGemma's) cannot take: more tokens than
    one prefill chunk holds; prompt_logprobs (the all-positions pass is causal)."""
    if len(ids) > max_batched:
        raise ValueError(f"the prompt takes {len(ids)} tokens, more than max_num_batched_tokens {max_batched}, and "
                         "this model's prompt is one bidirectional prefix (one prefill chunk holds all of it); "
                         "raise max_num_batched_tokens")
    if params.prompt_logprobs is not None:
        raise ValueError("prompt_logprobs is not served on this model yet (its prompt is one bidirectional prefix, "
                         "which the all-positions pass does not run); leave it unset")


def _checked_embeds(given: tuple[ImageInput, ...], params: SamplingParams, served: bool) -> tuple[ImageInput, ...]:
    """A prompt_embeds prompt's rows (entrypoints/prompt_embeds); ValueError naming what goes not with them."""
    if not served:
        raise ValueError("prompt_embeds needs an engine started with enable_prompt_embeds=True")
    if len(given) != 1 or given[0].offset != 0:
        raise ValueError("prompt_embeds: the embeddings are the whole prompt; images go in prompts of their own")
    if params.prompt_logprobs is not None:
        raise ValueError("prompt_logprobs is not served with prompt_embeds (the prompt has no token ids to "
                         "score; vLLM refuses it too); leave prompt_logprobs unset")
    return given
