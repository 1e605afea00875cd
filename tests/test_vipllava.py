"""VipLLaVA (LLaVA with feature layers concatenated through a LayerNorm before the projector) against HF
transformers on the same tiny weights: the prompt's ids HF's LlavaProcessor's, the image's rows and every position's
float32 logits, greedy tokens of two image prompts batched through the engine; a bad config refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from hf_models import COMMON, save_tiny_tokenizer
from PIL import Image
from test_pixtral import our_logits
from vision_models import IMAGE_TOKEN, TOWER, random_image

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import SUPPORTED_ARCHITECTURES
from jaxinfer.models.vision_language import read_vision_language_config

PROMPT = "USER: <image>\nThe quick brown fox ASSISTANT:"
GREEDY = SamplingParams(max_tokens=6, temperature=0)
# 16-token chunks cut each prompt's 16 image rows
KNOBS = dict(dtype="float32", max_seq_len=64, max_num_batched_tokens=16, page_size=8, num_pages=24, max_num_seqs=2,
             cpu_kernels=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random float32 VipLLaVA (2-layer CLIP tower over 32x32 images in 8x8 patches, its embeddings and second to
    last layer concatenated, a 2-layer Llama), its tokenizer and CLIP image processor, saved as transformers 5.24
    saves them."""
    path = tmp_path_factory.mktemp("vipllava")
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.save_pretrained(path)
    config = transformers.VipLlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**TOWER, projection_dim=32),
        text_config=transformers.LlamaConfig(**{**COMMON, "vocab_size": 320}), vision_feature_layer=[-2, 0],
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), image_seq_length=16)
    torch.manual_seed(0)
    model = transformers.VipLlavaForConditionalGeneration(config).eval()
    with torch.no_grad():  # a tower and projector loud enough that images move the logits; norms off their init
        for name, param in model.named_parameters():
            if "vision_tower" in name or "projector" in name:
                param.mul_(4.0) if param.dim() > 1 else param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(
        path)
    return path


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.VipLlavaForConditionalGeneration.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, **KNOBS)


def hf_inputs(llm: LLM, images: list[Image.Image]) -> dict:
    """HF's LlavaProcessor's ids and pixels (llava-hf/vip-llava-7b-hf's processor) for PROMPT once per image."""
    processor = transformers.LlavaProcessor(image_processor=llm.image_prompts.processor(), tokenizer=llm.tokenizer,
                                            patch_size=8, vision_feature_select_strategy="default",
                                            num_additional_image_tokens=1)
    out = processor(text=[PROMPT] * len(images), images=images, return_tensors="pt")
    return {k: out[k] for k in ("input_ids", "pixel_values")}


def test_ids_rows_and_logits_match_hf(llm, hf_model):
    """The prompt's ids are HF's processor's; the image's 16 rows (embeddings and layer 1, LayerNormed, projected)
    and every position's float32 logits within 1e-5 of the largest of HF's."""
    image = Image.fromarray(random_image(0))
    inputs = hf_inputs(llm, [image])
    ids, (row_input,) = llm.image_prompts.prompt(PROMPT, [image], "test")
    assert ids == inputs["input_ids"][0].tolist()
    with torch.no_grad():
        expected = hf_model(**inputs).logits[0].numpy()
        hf_rows = hf_model.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output[0].numpy()
    (rows,) = llm.engine.runner.vision.encode([row_input])
    assert np.abs(rows - hf_rows).max() <= 1e-5 * np.abs(hf_rows).max()
    mask = np.asarray(ids) == llm.image_prompts.cfg.image_token_id
    placed = np.zeros((len(ids), rows.shape[-1]), np.float32)
    placed[mask] = rows
    assert np.abs(our_logits(llm, np.asarray(ids), placed, mask) - expected).max() <= 1e-5 * np.abs(expected).max()


def test_batched_greedy_matches_hf(llm, hf_model):
    """Two image prompts batched through the engine (16-token chunks cutting the images) give HF generate's greedy
    tokens for the two batched."""
    images = [Image.fromarray(random_image(seed)) for seed in (1, 2)]
    outs = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": image}} for image in images], GREEDY)
    inputs = hf_inputs(llm, images)
    with torch.no_grad():
        expected = hf_model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False)
    got = [out.outputs[0].token_ids for out in outs]
    assert got == expected[:, inputs["input_ids"].shape[1]:].tolist() and got[0] != got[1]


def test_registry_and_refusals(model_dir):
    """VipLlavaForConditionalGeneration is served; a feature layer past the tower is refused by name."""
    hf = json.loads((model_dir / "config.json").read_text())
    assert "VipLlavaForConditionalGeneration" in SUPPORTED_ARCHITECTURES
    with pytest.raises(ConfigError, match=r"vision_feature_layer \(-2, 5\) is out of range for 2 tower layers"):
        read_vision_language_config({**hf, "vision_feature_layer": [-2, 5]})
