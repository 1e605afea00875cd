"""LLaVA's vision tower and projector against HF transformers on the same tiny weights and pixels."""

from __future__ import annotations

import json

import numpy as np
import torch
import transformers
from vision_models import save_tiny_llava

from jaxinfer.checkpoint.loader import load_vision_weights
from jaxinfer.models import load_config
from jaxinfer.models.llava import image_features, read_llava_config


def test_llava_reads_its_language_model_as_the_text_family(tmp_path):
    path = save_tiny_llava(tmp_path)
    cfg = load_config(path)
    assert cfg.architecture == "LlamaForCausalLM" and cfg.vocab_size == 320 and cfg.num_layers == 2


def test_feature_layers_and_full_strategy_match_hf(tmp_path):
    """A list of feature layers (concatenated) and the "full" strategy (class token kept): 17 rows an image."""
    path = save_tiny_llava(tmp_path, vision_feature_layer=[-3, -1], vision_feature_select_strategy="full")
    config = json.loads((path / "config.json").read_text())
    config["image_seq_length"] = 17
    cfg = read_llava_config(config)
    model = transformers.LlavaForConditionalGeneration.from_pretrained(path).eval()
    pixels = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        expected = model.model.get_image_features(pixel_values=torch.tensor(pixels))
    expected = np.stack([np.asarray(e) for e in getattr(expected, "pooler_output", expected)])
    got = np.asarray(image_features(load_vision_weights(path, cfg, np.float32), pixels, cfg))
    assert got.shape == expected.shape == (2, 17, 64)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


