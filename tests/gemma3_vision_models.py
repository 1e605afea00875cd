"""A tiny Gemma 3 vision-language checkpoint (2-layer SigLIP tower over 32x32 images in 8x8 patches, pooled 2x2
to 4 image tokens, before a tiny Gemma 3 text model whose sliding layer's window of 3 is shorter than an image),
saved with its tokenizer and image processor like a real one."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from hf_models import ARCH_CONFIGS, COMMON, save_tiny_tokenizer
from vision_models import TOWER

BOI, EOI, SOFT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
CHAT_TEMPLATE = (  # Gemma's turns; image parts render as the start-of-image mark
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<start_of_image>"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
WINDOW = 3  # the sliding layer's window: an image token's window ends before its image does


def make_gemma3_vision(boi: int, eoi: int, soft: int) -> transformers.Gemma3ForConditionalGeneration:
    """A random float32 Gemma 3 vision model: SigLIP tower (TOWER), 16 patches pooled to 4 rows, a 2-layer
    Gemma 3 text model (one sliding layer, one global)."""
    text_kwargs = {**ARCH_CONFIGS["gemma3"][1], "sliding_window": WINDOW}
    text = transformers.Gemma3TextConfig(**{**COMMON, "vocab_size": 320, **text_kwargs})
    config = transformers.Gemma3Config(vision_config=transformers.SiglipVisionConfig(**TOWER).to_dict(),
                                       text_config=text.to_dict(), mm_tokens_per_image=4, boi_token_index=boi,
                                       eoi_token_index=eoi, image_token_index=soft)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # a tower and projector loud enough that images move the logits; norms off their init
        for name, param in model.named_parameters():
            if "vision_tower" in name or "multi_modal_projector" in name:
                if param.dim() > 1:
                    param.mul_(4.0) if "vision_tower" in name else param.normal_(0.0, 0.5)
                else:
                    param.add_(0.1 * torch.randn_like(param))
    return model


def save_tiny_gemma3_vision(path: Path) -> Path:
    """Save the tiny model with a tokenizer holding Gemma 3's image tokens and a Gemma 3 image processor (32x32)."""
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": [BOI, EOI, SOFT]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    boi, eoi, soft = tokenizer.convert_tokens_to_ids([BOI, EOI, SOFT])
    make_gemma3_vision(boi, eoi, soft).save_pretrained(path, safe_serialization=True)
    transformers.Gemma3ImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    return path
