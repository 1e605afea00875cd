"""A tiny LLaVA checkpoint (2-layer CLIP tower over 32x32 images in 8x8 patches, a tiny Llama), saved with
its tokenizer and image processor like a real one, and the images the tests send it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers
from hf_models import COMMON, save_tiny_tokenizer

IMAGE_TOKEN = "<image>"
CHAT_TEMPLATE = (  # llava-1.5's shape: "USER: <image>\n... ASSISTANT:"; image parts render as the placeholder
    "{% for m in messages %}{{ m['role'].upper() }}: {% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>\n{% else %}{{ p['text'] }}"
    "{% endif %}{% endfor %}{% endif %}\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
             patch_size=8)


def make_llava(image_token_id: int, siglip: bool = False, **overrides) -> transformers.LlavaForConditionalGeneration:
    """A random float32 LLaVA: CLIP tower (SigLIP's with siglip) of 2 layers (32 wide), 16 patches per image,
    a 2-layer Llama (COMMON)."""
    vision = (transformers.SiglipVisionConfig(**TOWER) if siglip
              else transformers.CLIPVisionConfig(**TOWER, projection_dim=32))
    text = transformers.LlamaConfig(**{**COMMON, "vocab_size": 320})  # the tokenizer's 256 bytes, specials, merges
    config = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token_id,
                                      image_seq_length=15 if siglip else 16, **overrides)
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():  # a tower and projector loud enough that images move the logits, biases and norms
        for name, param in model.named_parameters():  # away from their trivial values (SigLIP's init zeros some)
            if "vision_tower" in name or "projector" in name:
                if param.dim() > 1:
                    param.mul_(4.0)
                else:
                    param.add_(0.1 * torch.randn_like(param))
    return model


def save_tiny_llava(path: Path, siglip: bool = False, **overrides) -> Path:
    """Save the tiny LLaVA with a tokenizer holding `<image>` and a CLIP image processor (32x32)."""
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    make_llava(image_token_id, siglip, **overrides).save_pretrained(path, safe_serialization=True)
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(
        path)
    return path


def random_image(seed: int, size: int = 40) -> np.ndarray:
    """A random RGB image [size, size, 3] uint8 (the processor resizes and crops it to 32x32)."""
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
