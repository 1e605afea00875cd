"""Aya Vision (a SigLIP tower, pixel shuffle, LayerNorm and SwiGLU projector, Cohere2) against HF transformers on the
same tiny weights: the prompt's ids HF's AyaVisionProcessor's for a wide and a tall image (tiles by aspect ratio and
the thumbnail), the tiles' rows and every position's float32 logits, greedy tokens of two image prompts batched
through the engine; bad configs refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from hf_models import COMMON, save_tiny_tokenizer
from PIL import Image
from test_pixtral import our_logits
from vision_models import random_image

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import SUPPORTED_ARCHITECTURES
from jaxinfer.models.vision_language import read_vision_language_config

MARKS = ["<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "TILE", "TILE_GLOBAL"]
PROMPT = "USER: <image>\nThe quick brown fox ASSISTANT:"
GREEDY = SamplingParams(max_tokens=6, temperature=0)
# 16-token chunks cut the tiles' runs; two prompts of up to 3 tiles (4 rows each) decode together
KNOBS = dict(dtype="float32", max_seq_len=96, max_num_batched_tokens=16, page_size=8, num_pages=32, max_num_seqs=2,
             cpu_kernels=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random float32 Aya Vision (2-layer SigLIP over 32-pixel tiles of 8x8 patches shuffled 2x2: 4 rows a tile;
    a 2-layer Cohere2, its first layer sliding over 8 tokens), its tokenizer and GotOcr2 image processor (up to 6
    tiles), saved as transformers 5.24 saves them."""
    path = tmp_path_factory.mktemp("aya_vision")
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": MARKS})
    tokenizer.save_pretrained(path)
    text = {**COMMON, "vocab_size": 320, "model_type": "cohere2", "sliding_window": 8, "layer_norm_eps": 1e-5,
            "logit_scale": 0.25, "layer_types": ["sliding_attention", "full_attention"]}
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, image_size=32, patch_size=8, vision_use_head=False)
    config = transformers.AyaVisionConfig(vision_config=vision, text_config=text, downsample_factor=2,
                                          alignment_intermediate_size=96,
                                          image_token_index=tokenizer.convert_tokens_to_ids("<|IMG_PATCH|>"))
    torch.manual_seed(0)
    model = transformers.AyaVisionForConditionalGeneration(config).eval()
    with torch.no_grad():  # a tower loud enough that images move the logits (the SwiGLU squares the projector's
        for name, param in model.named_parameters():  # scale: left as initialized); norms and biases off their init
            if "vision_tower" in name or "projector" in name:
                param.mul_(2.0 if "vision_tower" in name else 1.0) if param.dim() > 1 else \
                    param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    transformers.GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, max_patches=6).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.AyaVisionForConditionalGeneration.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, **KNOBS)


def wide() -> Image.Image:
    """2 x 1 tiles and the thumbnail."""
    return Image.fromarray(random_image(0, 56)).resize((80, 36))


def tall() -> Image.Image:
    """1 x 3 tiles and the thumbnail."""
    return Image.fromarray(random_image(1, 56)).resize((30, 90))


def hf_inputs(llm: LLM, texts: list[str], images: list[Image.Image]) -> dict:
    """HF's AyaVisionProcessor's ids, attention mask and tiles (left-padded, as it pads)."""
    processor = transformers.AyaVisionProcessor(image_processor=llm.image_prompts.processor(), tokenizer=llm.tokenizer,
                                                patch_size=8, img_size=32, downsample_factor=2)
    return dict(processor(text=texts, images=images, return_tensors="pt"))


def checked_rows(llm: LLM, hf_model, image: Image.Image, count: int) -> tuple[list[int], dict, np.ndarray]:
    """(ids, HF's inputs, the tiles' rows) of PROMPT with one image, its ids HF's processor's and its `count` tiles'
    rows within 1e-5 of the largest of HF's get_image_features."""
    inputs = hf_inputs(llm, [PROMPT], [image])
    inputs.pop("num_patches", None)
    ids, tiles = llm.image_prompts.prompt(PROMPT, [image], "test")
    assert ids == inputs["input_ids"][0].tolist() and len(tiles) == count
    with torch.no_grad():
        hf_rows = hf_model.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output.numpy()
    rows = np.stack(llm.engine.runner.vision.encode(list(tiles)))
    assert np.abs(rows - hf_rows).max() <= 1e-5 * np.abs(hf_rows).max()
    return ids, inputs, rows


def test_ids_rows_and_logits_match_hf(llm, hf_model):
    """A wide and a tall image, each alone: the ids are HF's processor's (TILE_i runs, TILE_GLOBAL, the
    thumbnail's) and the tiles' rows HF's; the wide one's every position's float32 logits within 1e-5 of the largest
    (one prompt length: one more forward program)."""
    ids, inputs, rows = checked_rows(llm, hf_model, wide(), 3)
    checked_rows(llm, hf_model, tall(), 4)
    with torch.no_grad():
        expected = hf_model(**inputs).logits[0].numpy()
    mask = np.asarray(ids) == llm.image_prompts.cfg.image_token_id
    placed = np.zeros((len(ids), rows.shape[-1]), np.float32)
    placed[mask] = rows.reshape(-1, rows.shape[-1])
    got = our_logits(llm, np.asarray(ids), placed, mask)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_batched_greedy_matches_hf(llm, hf_model):
    """The wide and the tall image's prompts batched through the engine (16-token chunks cutting tiles) give HF
    generate's greedy tokens for the two batched (left-padded)."""
    images = [wide(), tall()]
    outs = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": image}} for image in images], GREEDY)
    inputs = hf_inputs(llm, [PROMPT, PROMPT], images)
    inputs.pop("num_patches", None)
    with torch.no_grad():
        expected = hf_model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False)
    got = [out.outputs[0].token_ids for out in outs]
    assert got == expected[:, inputs["input_ids"].shape[1]:].tolist() and got[0] != got[1]


def test_registry_and_refusals(model_dir):
    """AyaVisionForConditionalGeneration is served; a strategy leaving no square grid, a shuffle not dividing the
    tower's grid and an odd SwiGLU width are refused by name."""
    hf = json.loads((model_dir / "config.json").read_text())
    assert "AyaVisionForConditionalGeneration" in SUPPORTED_ARCHITECTURES
    for field, value, accepted in [("vision_feature_select_strategy", "default", "'full' with SigLIP"),
                                   ("downsample_factor", 3, "a divisor of the tower's 4 patches"),
                                   ("alignment_intermediate_size", 95, "an even size")]:
        with pytest.raises(ConfigError, match=f"{field} .*supported: {accepted}"):
            read_vision_language_config({**hf, field: value})
