"""ModelConfig from HF configs: presets, both transformers layouts, per-family flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxinfer import ConfigError, from_hf_config

PRESETS = sorted((Path(__file__).parents[1] / "configs").glob("*.json"))


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_presets_parse(path):
    cfg = from_hf_config(json.loads(path.read_text()))
    assert cfg.num_heads % cfg.num_kv_heads == 0
    hash(cfg)  # usable as a jit static argument


def test_transformers4_layout_with_rope_scaling():
    cfg = from_hf_config(dict(
        architectures=["LlamaForCausalLM"], vocab_size=8, hidden_size=8, intermediate_size=8,
        num_hidden_layers=1, num_attention_heads=2, rope_theta=500000.0,
        rope_scaling=dict(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
    ))
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling.rope_type == "llama3"
    assert cfg.num_kv_heads == 2 and cfg.head_dim == 4


def test_family_flags():
    base = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=4, num_attention_heads=2)
    qwen2 = from_hf_config({**base, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True,
                            "sliding_window": 32, "max_window_layers": 2})
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.layer_windows == (0, 0, 32, 32)
    gemma = from_hf_config({**base, "architectures": ["GemmaForCausalLM"]})
    assert gemma.norm_weight_offset == 1.0 and gemma.scale_embeddings and gemma.tie_word_embeddings
    assert gemma.activation == "gelu_tanh"
    mistral = from_hf_config({**base, "architectures": ["MistralForCausalLM"], "sliding_window": 16})
    assert mistral.layer_windows == (16,) * 4
    qwen3 = from_hf_config({**base, "architectures": ["Qwen3ForCausalLM"], "head_dim": 16})
    assert qwen3.qk_norm and qwen3.head_dim == 16


def test_gqa_mismatch_is_explained():
    with pytest.raises(ConfigError, match="must be a multiple of num_key_value_heads"):
        from_hf_config(dict(architectures=["LlamaForCausalLM"], vocab_size=8, hidden_size=12,
                            intermediate_size=8, num_hidden_layers=1, num_attention_heads=3,
                            num_key_value_heads=2))
