"""A tiny Llama 3.2 Vision (MllamaForConditionalGeneration) for tests/test_mllama*.py: two text layers (the second a
cross-attention layer, its gates opened), a 2 + 1-layer tower over 28-pixel tiles of 14-pixel patches, up to 2 tiles."""

from __future__ import annotations

import torch
import transformers

VOCAB = 256  # the <|image|> id is VOCAB, the first of the embedding's 8 extra rows
TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, cross_attention_layers=[1],
            bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.1,
            rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                 high_freq_factor=4.0, original_max_position_embeddings=64))
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1, attention_heads=2,
              image_size=28, patch_size=14, max_num_tiles=2, intermediate_layers_indices=[1, 0], vision_output_dim=96,
              supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]])


def gated(model: torch.nn.Module) -> torch.nn.Module:
    """model with its gates opened: transformers initialises the cross-attention and tile-embedding gates to zero,
    which would hide a cross-attention layer run by mistake (tanh(0) = 0) or a tile embedding read wrong."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("cross_attn_attn_gate", "cross_attn_mlp_gate", ".gate")):
                param.fill_(0.7)
    return model


def make_mllama(seed: int = 0) -> torch.nn.Module:
    """HF's tiny MllamaForConditionalGeneration, float32, gates opened."""
    torch.manual_seed(seed)
    config = transformers.MllamaConfig(text_config=TEXT, vision_config=VISION, image_token_index=VOCAB)
    return gated(transformers.MllamaForConditionalGeneration(config)).eval()
