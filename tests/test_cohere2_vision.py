"""Cohere2 Vision (a SigLIP tower's output, pixel shuffle, SwiGLU projector, Cohere2) against HF transformers on the
same tiny weights: the tile grid HF's get_optimal_tiled_canvas picks, the prompt's ids HF's Cohere2VisionProcessor's
for a wide and a tall image, the tiles' rows and every position's float32 logits, greedy tokens of two image prompts
batched through the engine; a bad config refused by name. HF's image processor needs torchvision (absent here): the
tiles are the PIL port's (entrypoints/cohere2_vision_tiles), given to HF's model and processor alike."""

from __future__ import annotations

import ast
import functools
import inspect
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
from jaxinfer.entrypoints.cohere2_vision_tiles import best_grid
from jaxinfer.models.registry import SUPPORTED_ARCHITECTURES
from jaxinfer.models.vision_language import read_vision_language_config

MARKS = {"boi_token": "<|START_OF_IMG|>", "eoi_token": "<|END_OF_IMG|>", "image_token": "<|IMG_PATCH|>",
         "img_line_break_token": "<|IMG_LINE_BREAK|>"}
PROMPT = "USER: <|IMG_PATCH|>\nThe quick brown fox ASSISTANT:"
GREEDY = SamplingParams(max_tokens=6, temperature=0)
# 16-token chunks cut the tiles' runs; two prompts of up to 4 tiles (4 rows and a break each) decode together
KNOBS = dict(dtype="float32", max_seq_len=96, max_num_batched_tokens=16, page_size=8, num_pages=32, max_num_seqs=2,
             cpu_kernels=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random float32 Cohere2 Vision (2-layer SigLIP with its pooling head, over 32-pixel tiles of 8x8 patches
    shuffled 2x2: 4 rows a tile; a 2-layer Cohere2, its first layer sliding over 8 tokens), its tokenizer and
    preprocessor_config.json (up to 6 tiles), saved as transformers 5.24 saves them."""
    path = tmp_path_factory.mktemp("cohere2_vision")
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": list(MARKS.values())})
    tokenizer.save_pretrained(path)
    text = {**COMMON, "vocab_size": 320, "model_type": "cohere2", "sliding_window": 8, "layer_norm_eps": 1e-5,
            "logit_scale": 0.25, "layer_types": ["sliding_attention", "full_attention"]}
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, image_size=32, patch_size=8)
    config = transformers.Cohere2VisionConfig(vision_config=vision, text_config=text, downsample_factor=2,
                                              alignment_intermediate_size=96,
                                              image_token_id=tokenizer.convert_tokens_to_ids(MARKS["image_token"]))
    torch.manual_seed(0)
    model = transformers.Cohere2VisionForConditionalGeneration(config).eval()
    with torch.no_grad():  # a tower loud enough that images move the logits (the SwiGLU squares the projector's
        for name, param in model.named_parameters():  # scale: left as initialized); norms and biases off their init
            if "vision_tower" in name or "projector" in name:
                param.mul_(2.0 if "vision_tower" in name else 1.0) if param.dim() > 1 else \
                    param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    settings = {"image_processor_type": "Cohere2VisionImageProcessor", "size": {"height": 32, "width": 32},
                "max_patches": 6, "min_patches": 1, "crop_to_patches": True, "patch_size": 2}
    (path / "preprocessor_config.json").write_text(json.dumps(settings))
    return path


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.Cohere2VisionForConditionalGeneration.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, **KNOBS)


def wide() -> Image.Image:
    """3 x 1 tiles and the thumbnail."""
    return Image.fromarray(random_image(0, 56)).resize((90, 30))


def tall() -> Image.Image:
    """1 x 2 tiles and the thumbnail."""
    return Image.fromarray(random_image(1, 56)).resize((30, 60))


class TileList(transformers.GotOcr2ImageProcessorPil):
    """The PIL port over a list of images, as HF's processor calls its image processor (`patch_size`: rows a tile
    side after the shuffle; the base class: HF's image processor plumbing)."""

    patch_size = 2

    def __init__(self, tiles):
        super().__init__()
        self.tiles = tiles

    def __call__(self, images, **_):
        made = [self.tiles(image) for image in images]
        return transformers.BatchFeature({"pixel_values": np.concatenate([m["pixel_values"] for m in made]),
                                          "num_patches": [int(m["num_patches"][0]) for m in made]})


class HFProcessor(transformers.Cohere2VisionProcessor):
    """HF's Cohere2VisionProcessor over the PIL port (its own image processor needs torchvision)."""

    def check_argument_for_proper_class(self, name, argument):
        return None


def hf_inputs(llm: LLM, images: list[Image.Image]) -> dict:
    """HF's Cohere2VisionProcessor's ids and attention mask (left-padded) and the tiles for PROMPT once per image."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(llm.model_dir, extra_special_tokens=MARKS,
                                                           padding_side="left")
    processor = HFProcessor(image_processor=TileList(llm.image_prompts.processor()), tokenizer=tokenizer)
    out = processor(text=[PROMPT] * len(images), images=images, return_tensors="pt", padding=True)
    return {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"],
            "pixel_values": torch.tensor(np.asarray(out["pixel_values"]))}


def hf_tiled_canvas():
    """HF's get_optimal_tiled_canvas, read from its module's source (the module imports torchvision)."""
    from transformers.models import cohere2_vision

    path = inspect.getfile(cohere2_vision).replace("__init__.py", "image_processing_cohere2_vision.py")
    tree = ast.parse(open(path).read())
    wanted = {"get_all_supported_aspect_ratios", "get_optimal_tiled_canvas"}
    scope = {"np": np, "lru_cache": functools.lru_cache}
    exec(compile(ast.Module([n for n in tree.body if getattr(n, "name", "") in wanted], []), path, "exec"), scope)
    return scope["get_optimal_tiled_canvas"]


def test_tile_grid_is_hfs():
    """The grid (columns, rows) is HF's for images wider, taller, smaller and larger than the tiles allow."""
    theirs = hf_tiled_canvas()
    for height, width in [(30, 90), (60, 30), (20, 20), (500, 40), (33, 33), (100, 300), (64, 96)]:
        assert best_grid(height, width, 32, 6) == tuple(theirs((height, width), (32, 32), 1, 6))


def checked_rows(llm: LLM, hf_model, image: Image.Image, count: int) -> tuple[list[int], dict, np.ndarray]:
    """(ids, HF's inputs, the tiles' rows) of PROMPT with one image, its ids HF's processor's and its `count` tiles'
    rows within 1e-5 of the largest of HF's get_image_features."""
    inputs = hf_inputs(llm, [image])
    ids, tiles = llm.image_prompts.prompt(PROMPT, [image], "test")
    assert ids == inputs["input_ids"][0].tolist() and len(tiles) == count
    with torch.no_grad():
        hf_rows = hf_model.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output.numpy()
    rows = np.stack(llm.engine.runner.vision.encode(list(tiles)))
    assert np.abs(rows - hf_rows).max() <= 1e-5 * np.abs(hf_rows).max()
    return ids, inputs, rows


def test_ids_rows_and_logits_match_hf(llm, hf_model):
    """A wide and a tall image, each alone: the ids are HF's processor's (<|START_OF_IMG|>, each tile's patches and
    line break, the thumbnail's, <|END_OF_IMG|>) and the tiles' rows HF's; the wide one's every position's float32
    logits within 1e-5 of the largest (one prompt length: one more forward program)."""
    ids, inputs, rows = checked_rows(llm, hf_model, wide(), 4)
    checked_rows(llm, hf_model, tall(), 3)
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
    inputs = hf_inputs(llm, images)
    with torch.no_grad():
        expected = hf_model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False)
    got = [out.outputs[0].token_ids for out in outs]
    assert got == expected[:, inputs["input_ids"].shape[1]:].tolist() and got[0] != got[1]


def test_registry_and_refusals(model_dir):
    """Cohere2VisionForConditionalGeneration is served; a shuffle not dividing the tower's grid is refused by name."""
    hf = json.loads((model_dir / "config.json").read_text())
    assert "Cohere2VisionForConditionalGeneration" in SUPPORTED_ARCHITECTURES
    with pytest.raises(ConfigError, match="downsample_factor 3 .*supported: a divisor of the tower's 4 patches"):
        read_vision_language_config({**hf, "downsample_factor": 3})
