"""Tiny Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE and Qwen3.5 checkpoints (2-layer towers over 8x8 patches merged
2x2, a 2-layer language model (Qwen3-VL's: 3 layers, DeepStack adding to the first 2) whose rope splits its 8
frequencies into M-RoPE sections 2, 3, 3), saved with a tokenizer holding the vision tokens and a Qwen2-VL image
processor like real ones (Qwen3-VL's: its mean and std of 0.5, and a Qwen3VLVideoProcessor's settings). Qwen3-VL-MoE's
experts are stored as the hub's checkpoints hold them (gate_up_proj [E, D, 2F], down_proj [E, F, D]; transformers 5
saves them transposed). Qwen3.5's is Qwen3-VL's tower without DeepStack over Qwen3.5's hybrid language model."""

from __future__ import annotations

import json
import types
from pathlib import Path

import torch
import transformers
from hf_models import COMMON, save_tiny_tokenizer
from safetensors.torch import load_file, save_file

VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"
CHAT_TEMPLATE = (  # Qwen's turns; an image part renders as the vision start, image pad and vision end tokens
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MROPE_SECTION = [2, 3, 3]  # head_dim 16: 8 rotary frequencies
TOWERS = {  # 8x8 patches, merged 2x2 (one image token per 16x16 pixels)
    "qwen2_vl": dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, patch_size=8, mlp_ratio=2),
    # window of 32 pixels (2x2 merged tokens) with layer 1 attending to the whole image
    "qwen2_5_vl": dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=48, num_heads=2, patch_size=8,
                       window_size=32, fullatt_block_indexes=[1]),
    # a 4x4 learned position grid resampled to each image's patches; DeepStack from both layers
    "qwen3_vl": dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=48, num_heads=2, patch_size=8,
                     num_position_embeddings=16, deepstack_visual_indexes=[0, 1]),
}
TOWERS["qwen3_vl_moe"] = TOWERS["qwen3_vl"]
TOWERS["qwen3_5"] = {k: v for k, v in TOWERS["qwen3_vl"].items() if k != "deepstack_visual_indexes"}
# Qwen3.5: a DeltaNet layer, then gated attention turning half of each 32-dim head (8 of its 16 frequencies in
# the M-RoPE sections); head_dim sets where the rotary stops, so the sections must add up to the rotary's half
QWEN3_5_TEXT = dict(head_dim=32, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                    linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                    intermediate_size=48)
ROPE = {"qwen3_5": {"partial_rotary_factor": 0.5}}
TEXT = {"qwen3_vl": dict(num_hidden_layers=3, head_dim=16),  # experts of 24 units: 2F differs from D (64)
        "qwen3_vl_moe": dict(num_hidden_layers=3, head_dim=16, num_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=24),
        "qwen3_5": QWEN3_5_TEXT}
CLASSES = {"qwen2_vl": (transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration),
           "qwen2_5_vl": (transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration),
           "qwen3_vl": (transformers.Qwen3VLConfig, transformers.Qwen3VLForConditionalGeneration),
           "qwen3_vl_moe": (transformers.Qwen3VLMoeConfig, transformers.Qwen3VLMoeForConditionalGeneration),
           "qwen3_5": (transformers.Qwen3_5Config, transformers.Qwen3_5ForConditionalGeneration)}
PROCESSORS = {"qwen2_vl": transformers.Qwen2VLProcessor, "qwen2_5_vl": transformers.Qwen2_5_VLProcessor,
              "qwen3_vl": transformers.Qwen3VLProcessor}
PIXELS = dict(min_pixels=16 * 16, max_pixels=64 * 64)  # 1 to 16 image tokens
# Qwen3VLVideoProcessor's settings: its pixel bounds cover a clip's frames (4 frames of 48 x 80 kept as they are)
QWEN3_VIDEO = dict(video_processor_type="Qwen3VLVideoProcessor", patch_size=8, temporal_patch_size=2, merge_size=2,
                   size={"shortest_edge": 2 * 16 * 16, "longest_edge": 4 * 64 * 64}, image_mean=[0.5] * 3,
                   image_std=[0.5] * 3, fps=2, do_sample_frames=True, min_frames=4, max_frames=768)


def make_qwen2_vl(kind: str, ids: dict[str, int]) -> transformers.PreTrainedModel:
    """A random float32 model of `kind` ("qwen2_vl" or "qwen2_5_vl") over COMMON's language model."""
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": MROPE_SECTION, **ROPE.get(kind, {})}
    text = {**COMMON, "vocab_size": 320, "rope_parameters": rope, **TEXT.get(kind, {})}
    config_class, model_class = CLASSES[kind]
    config = config_class(text_config=text, vision_config=TOWERS[kind], image_token_id=ids[IMAGE_PAD],
                          video_token_id=ids[VIDEO_PAD], vision_start_token_id=ids[VISION_START],
                          vision_end_token_id=ids[VISION_END], bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():  # a tower loud enough that images move the logits; norms and biases off their init
        for name, param in model.named_parameters():
            if "visual" in name:
                param.mul_(4.0) if param.dim() > 1 else param.add_(0.1 * torch.randn_like(param))
            elif kind == "qwen3_5" and param.dim() == 1:  # zero-centred norms, dt_bias, A_log
                param.add_(0.1 * torch.randn_like(param))
    return model


def save_tiny_qwen2_vl(path: Path, kind: str = "qwen2_vl") -> Path:
    """Save the tiny model with its tokenizer (Qwen's vision tokens, a chat template) and image processor."""
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": [VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    ids = dict(zip([VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD],
                   tokenizer.convert_tokens_to_ids([VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD])))
    make_qwen2_vl(kind, ids).save_pretrained(path, safe_serialization=True)
    if kind == "qwen3_vl_moe":
        as_on_the_hub(path / "model.safetensors")
    norm = dict(image_mean=[0.5] * 3, image_std=[0.5] * 3) if kind.startswith("qwen3") else {}
    transformers.Qwen2VLImageProcessor(patch_size=8, merge_size=2, **PIXELS, **norm).save_pretrained(path)
    if kind == "qwen3_vl":  # Qwen3-VL ships its own video processor's settings (its class needs torchvision)
        (path / "video_preprocessor_config.json").write_text(json.dumps(QWEN3_VIDEO))
    return path


def as_on_the_hub(file: Path) -> None:
    """Rewrite transformers' fused experts [E, 2F, D] and [E, D, F] as the hub's [E, D, 2F] and [E, F, D]."""
    tensors = load_file(file)
    fused = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")
    save_file({k: v.transpose(1, 2).contiguous() if k.endswith(fused) else v for k, v in tensors.items()}, file,
              metadata={"format": "pt"})


def hf_video_text(kind: str, text: str, grid: list[int], fps: float | None, indices: list[int]) -> str:
    """The prompt text HF's processor makes of one video's pad (Qwen3-VL: with its frame groups' timestamps): its own
    replace_video_token on a processor built without its video processor (whose class needs torchvision)."""
    from transformers.video_utils import VideoMetadata

    processor = object.__new__(PROCESSORS[kind])
    processor.video_token, processor.vision_start_token = VIDEO_PAD, VISION_START
    processor.vision_end_token = VISION_END
    processor.video_processor = types.SimpleNamespace(merge_size=2, temporal_patch_size=2)
    metadata = VideoMetadata(total_num_frames=len(indices), fps=fps, frames_indices=indices)
    inputs = {"video_grid_thw": torch.tensor([grid]), "video_metadata": [metadata]}
    return text.replace(VIDEO_PAD, processor.replace_video_token(inputs, 0))
