"""A tiny random Whisper checkpoint saved with transformers, its feature extractor and tokenizer beside it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers
from hf_models import TOKENIZER_CORPUS

SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|fr|>", "<|translate|>", "<|transcribe|>",
            "<|notimestamps|>"]
PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
CHUNK_SECONDS = 1  # the feature extractor's window: 16000 samples, 100 frames, 50 encoder positions
FRAMES = 50


def save_whisper_tokenizer(path: Path) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with Whisper's special tokens (first: <|endoftext|> is id 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TOKENIZER_CORPUS, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                                pad_token="<|endoftext|>", additional_special_tokens=SPECIALS[1:])
    fast.save_pretrained(path)
    return fast


def make_whisper(vocab_size: int, **overrides) -> transformers.WhisperForConditionalGeneration:
    """A random float32 2+2-layer Whisper (d_model 32) over 50 encoder positions; matrices normal with std
    2 / sqrt(fan-in) (greedy tokens then vary with the audio), norms and biases moved off their init."""
    config = transformers.WhisperConfig(**{**dict(
        vocab_size=vocab_size, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=80,
        max_source_positions=FRAMES, max_target_positions=64, decoder_start_token_id=1, eos_token_id=0,
        pad_token_id=0, bos_token_id=0, suppress_tokens=[], begin_suppress_tokens=None), **overrides})
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "embed_positions" in name and "encoder" in name:
                continue  # the sinusoids
            if param.dim() > 1:
                param.normal_(0.0, 2.0 / param.shape[-1] ** 0.5)
            else:
                param.add_(0.1 * torch.randn_like(param))
    model.generation_config.forced_decoder_ids = None
    return model


def save_whisper(path: Path, **overrides) -> Path:
    """The checkpoint (WhisperConfig fields overridden), its tokenizer and its WhisperFeatureExtractor (1 s
    windows) in `path`."""
    tokenizer = save_whisper_tokenizer(path)
    make_whisper(len(tokenizer), **overrides).save_pretrained(path, safe_serialization=True)
    transformers.WhisperFeatureExtractor(feature_size=80, chunk_length=CHUNK_SECONDS).save_pretrained(path)
    return path


def tone(seconds: float, rate: int = 16000, pitch: float = 440.0, seed: int = 0) -> np.ndarray:
    """A float32 tone with some noise: something for the features to see."""
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).normal(0, 0.05, len(t))
    return (0.5 * np.sin(2 * np.pi * pitch * t) + noise).astype(np.float32)
