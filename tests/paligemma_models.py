"""Tiny PaliGemma checkpoints (a 2-layer SigLIP tower over 32x32 images in 16x16 patches: 4 image tokens, one linear
projector) before a tiny Gemma (PaliGemma) or Gemma 2 (PaliGemma 2), saved with a tokenizer holding `<image>` and a
SigLIP image processor like real ones."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from hf_models import ARCH_CONFIGS, COMMON, save_tiny_tokenizer
from vision_models import TOWER

IMAGE = "<image>"
PATCHES = 4  # 32x32 images in 16x16 patches: one image token per patch
WINDOW = 12  # PaliGemma 2's sliding window: shorter than the prompts (16, 19 tokens), whose prefix sees past it


def make_paligemma(image_token_id: int, gemma2: bool) -> transformers.PaliGemmaForConditionalGeneration:
    """A random float32 PaliGemma: the SigLIP tower, a 2-layer Gemma (gemma2: Gemma 2, soft caps and a sliding
    layer of WINDOW); eager attention, whose mask HF builds from token_type_ids."""
    family = "gemma2" if gemma2 else "gemma"
    config_class, kwargs = ARCH_CONFIGS[family]
    kwargs = {**kwargs, "sliding_window": WINDOW} if gemma2 else kwargs
    text = config_class(**{**COMMON, "vocab_size": 320, **kwargs})
    config = transformers.PaliGemmaConfig(
        vision_config=transformers.SiglipVisionConfig(**{**TOWER, "patch_size": 16}).to_dict(),
        text_config=text.to_dict(), image_token_index=image_token_id, projection_dim=COMMON["hidden_size"],
        hidden_size=COMMON["hidden_size"], vocab_size=320)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.PaliGemmaForConditionalGeneration(config).eval()
    with torch.no_grad():  # a tower and projector loud enough that images move the logits; biases and norms off zero
        for name, param in model.named_parameters():
            if "vision_tower" in name or "multi_modal_projector" in name:
                param.mul_(4.0) if param.dim() > 1 else param.add_(0.1 * torch.randn_like(param))
    return model


def save_tiny_paligemma(path: Path, gemma2: bool = False) -> Path:
    """Save the tiny model with its tokenizer (`<image>` added) and a SigLIP image processor (32x32)."""
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE]})
    tokenizer.save_pretrained(path)
    make_paligemma(tokenizer.convert_tokens_to_ids(IMAGE), gemma2).save_pretrained(path, safe_serialization=True)
    transformers.SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    return path


def hf_processor(path: Path) -> transformers.PaliGemmaProcessor:
    """HF's PaliGemmaProcessor over the saved tokenizer and image processor (the reference prompt layout)."""
    images = transformers.SiglipImageProcessor.from_pretrained(path)
    images.image_seq_length = PATCHES
    return transformers.PaliGemmaProcessor(image_processor=images,
                                           tokenizer=transformers.AutoTokenizer.from_pretrained(path))
