"""Tiny GLM-4.1V (Glm4vForConditionalGeneration), GLM-4.5V (Glm4vMoeForConditionalGeneration) and GLM-4.6V
(Glm46VForConditionalGeneration, its text_config a glm4v_moe_text) checkpoints: a 2-layer tower over 8x8 patches
merged 2x2 with a 4 x 4 learned position grid (32-pixel image_size), a 2-layer language model whose 32-dim heads
rotate half their dims (8 frequencies in M-RoPE sections 2, 3, 3; the MoE ones: a dense layer, then 4 experts of 24
units, 2 per token), saved with a tokenizer holding GLM's image and video tokens and a Glm4v image processor keeping
images within 64 x 64 pixels (at most 16 image tokens)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from hf_models import COMMON, save_tiny_tokenizer

BEGIN, IMAGE, END = "<|begin_of_image|>", "<|image|>", "<|end_of_image|>"
VIDEO_TOKENS = ["<|begin_of_video|>", "<|video|>", "<|end_of_video|>"]
CHAT_TEMPLATE = (  # GLM's turns; an image part renders as the begin, image and end tokens
    "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MROPE_SECTION = [2, 3, 3]
TOWER = dict(depth=2, hidden_size=32, num_heads=2, patch_size=8, image_size=32, out_hidden_size=64,
             intermediate_size=48, spatial_merge_size=2, temporal_patch_size=2)
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": MROPE_SECTION, "partial_rotary_factor": 0.5}
TEXT = {**COMMON, "vocab_size": 272, "num_attention_heads": 2, "num_key_value_heads": 1, "rope_parameters": ROPE}
MOE_TEXT = {**TEXT, "model_type": "glm4v_moe_text", "n_routed_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 24, "first_k_dense_replace": 1, "n_shared_experts": 1}
KINDS = {  # kind -> (config class, model class, text config, tower overrides)
    "glm4v": (transformers.Glm4vConfig, transformers.Glm4vForConditionalGeneration, TEXT, {}),
    "glm4v_moe": (transformers.Glm4vMoeConfig, transformers.Glm4vMoeForConditionalGeneration, MOE_TEXT,
                  {"attention_bias": True}),
    "glm46v": (transformers.Glm46VConfig, transformers.Glm46VForConditionalGeneration, MOE_TEXT, {}),
}
SIZE = {"shortest_edge": 2 * 16 * 16, "longest_edge": 2 * 64 * 64}  # two frames' pixels: 1 to 16 image tokens


def make_glm4v(kind: str, ids: dict[str, int]) -> transformers.PreTrainedModel:
    """A random float32 model of `kind` with its norms, biases and router bias moved off their init."""
    config_class, model_class, text, tower = KINDS[kind]
    vision = {**TOWER, **tower, **({"model_type": "glm4v_vision"} if kind == "glm46v" else {})}
    config = config_class(text_config=text, vision_config=vision, image_token_id=ids[IMAGE],
                          image_start_token_id=ids[BEGIN], image_end_token_id=ids[END],
                          video_token_id=ids[VIDEO_TOKENS[1]], video_start_token_id=ids[VIDEO_TOKENS[0]],
                          video_end_token_id=ids[VIDEO_TOKENS[2]])
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():  # a tower loud enough that images move the logits
        for name, param in model.named_parameters():
            if param.dim() == 1 or name.endswith("e_score_correction_bias"):
                param.add_(0.1 * torch.randn_like(param))
            elif "visual" in name:
                param.mul_(4.0)
    return model


def save_tiny_glm4v(path: Path, kind: str = "glm4v") -> Path:
    """Save the tiny model with its tokenizer (GLM's image and video tokens, a chat template) and image processor."""
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokens = [BEGIN, IMAGE, END, *VIDEO_TOKENS]
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    make_glm4v(kind, dict(zip(tokens, tokenizer.convert_tokens_to_ids(tokens)))).save_pretrained(path)
    transformers.Glm4vImageProcessorPil(patch_size=8, merge_size=2, size=SIZE).save_pretrained(path)
    return path


class HFProcessor(transformers.Glm4vProcessor):
    """HF's Glm4vProcessor without a video processor (its class needs torchvision, absent here)."""

    def check_argument_for_proper_class(self, name, argument):
        return None if argument is None else super().check_argument_for_proper_class(name, argument)


def hf_processor(path: Path) -> transformers.Glm4vProcessor:
    """HF's Glm4vProcessor over the saved tokenizer and image processor (the reference for prompt ids)."""
    return HFProcessor(image_processor=transformers.Glm4vImageProcessorPil.from_pretrained(path),
                       tokenizer=transformers.AutoTokenizer.from_pretrained(path))
