"""vLLM's audio prompts for an encoder-decoder speech model (Whisper): {"prompt": decoder text, "multi_modal_data":
{"audio": (samples, sample_rate)}} become the decoder's token ids and the audio's log-mel features
(`runtime/audio_input.AudioInput`), made by the checkpoint's `WhisperFeatureExtractor` (preprocessor_config.json).

Audio at another rate than the extractor's (16 kHz) is resampled (entrypoints/resample: a windowed-sinc low-pass,
then linear interpolation); stereo and other shapes are refused by name. A clip longer than the extractor's window
(`chunk_length`, 30 s) is refused: split it and transcribe the parts (the server cuts it into windows). The text
prompt is encoded without the tokenizer's own special tokens (Whisper's would add <|startoftranscript|> and
<|endoftext|> around it): it is the decoder's whole prefix, as vLLM takes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxinfer.entrypoints.resample import resample
from jaxinfer.runtime.audio_input import AudioInput

# vLLM's default decoder prompt: English, transcribe, no timestamps
DEFAULT_PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"


class AudioPrompts:
    """An encoder-decoder speech model's prompts: its feature extractor and tokenizer."""

    def __init__(self, model_dir: Path, tokenizer: Any, feature_shape: tuple[int, int]):
        """feature_shape: (mel bins, frames) the encoder takes; the extractor must make exactly that."""
        from transformers import WhisperFeatureExtractor

        self.extractor = WhisperFeatureExtractor.from_pretrained(model_dir)
        self.tokenizer = tokenizer
        made = (self.extractor.feature_size, self.extractor.nb_max_frames)
        if made != tuple(feature_shape):
            raise ValueError(f"{model_dir / 'preprocessor_config.json'}: its features are {made} (mel bins, frames); "
                             f"the encoder takes {tuple(feature_shape)}")

    @property
    def rate(self) -> int:
        """The sample rate the features are made at (Hz)."""
        return int(self.extractor.sampling_rate)

    def features(self, audio: Any, field: str) -> np.ndarray:
        """[mel bins, frames] float32 log-mel features of (samples, sample_rate); ValueError naming `field`."""
        if not isinstance(audio, (tuple, list)) or len(audio) != 2:
            raise ValueError(f"{field}: give (samples, sample_rate), a 1-D float array and its rate in Hz; "
                             f"got {type(audio).__name__}")
        samples, rate = audio
        if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
            raise ValueError(f"{field}: sample_rate must be a positive integer (Hz), got {rate!r}")
        samples = np.asarray(samples)
        if samples.ndim != 1 or not np.issubdtype(samples.dtype, np.number) or samples.size == 0:
            raise ValueError(f"{field}: samples must be a non-empty 1-D (mono) array of numbers, got shape "
                             f"{samples.shape} of {samples.dtype}")
        samples = resample(samples.astype(np.float32), int(rate), self.rate)
        limit = self.extractor.n_samples
        if len(samples) > limit:
            raise ValueError(f"{field}: {len(samples) / self.rate:.2f} s of audio is longer than the model's "
                             f"{limit / self.rate:g} s window; split it and transcribe each part")
        return self.extractor(samples, sampling_rate=self.rate, return_tensors="np").input_features[0]

    def prompt(self, prompt: Mapping[str, Any], field: str) -> tuple[list[int], tuple[AudioInput]]:
        """One dict prompt's decoder ids and audio; ValueError naming a key it cannot take."""
        unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids", "multi_modal_data"})
        data = prompt.get("multi_modal_data")
        if unknown or "prompt" in prompt and "prompt_token_ids" in prompt:
            raise ValueError(f"{field}: a speech model's dict prompt holds 'prompt' (text) or 'prompt_token_ids' "
                             f"and 'multi_modal_data': {{'audio': (samples, sample_rate)}}; got keys {sorted(prompt)}")
        if not isinstance(data, Mapping) or set(data) != {"audio"}:
            got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"{field}.multi_modal_data: this model takes {{'audio': (samples, sample_rate)}}, "
                             f"got {got}")
        features = self.features(data["audio"], f"{field}.multi_modal_data.audio")
        if "prompt_token_ids" in prompt:
            ids = [int(t) for t in prompt["prompt_token_ids"]]
        else:
            ids = self.tokenizer.encode(prompt.get("prompt", DEFAULT_PROMPT), add_special_tokens=False)
        return list(ids), (AudioInput(features),)

    def split(self, prompts: Any) -> tuple[list[Any], list[tuple]]:
        """vLLM's dict prompts (one or a list) as (decoder ids, their audio) pairs; other prompts pass as they
        are, without audio (the engine refuses them by name)."""
        if isinstance(prompts, Mapping) or isinstance(prompts, str) or not isinstance(prompts, Sequence):
            prompts = [prompts]
        out, audio = [], []
        for i, prompt in enumerate(prompts):
            ids, found = self.prompt(prompt, f"prompts[{i}]") if isinstance(prompt, Mapping) else (prompt, ())
            out.append(ids)
            audio.append(found)
        return out, audio
