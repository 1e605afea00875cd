"""Idefics2 (a SigLIP tower over tiles of many sizes, a gated projection and a Perceiver resampler, a Mistral) against
HF transformers on the same tiny weights, image splitting on: the prompt ids against HF's Idefics2Processor for a
wide and a tall image, the tiles' rows against get_image_features, every position's float32 logits of a prompt
with both images, greedy tokens and logprobs of two image prompts batched through the engine (and HF's expanded
ids), the registry, a refused config field and a refused tile size."""

from __future__ import annotations

import json
from pathlib import Path

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
from jaxinfer.entrypoints.idefics2_prompts import image_tiles
from jaxinfer.models.registry import SUPPORTED_ARCHITECTURES, from_hf_config
from jaxinfer.models.vision_language import read_vision_language_config

MARKS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>"]
# 32-pixel tiles at most, of 4x4-pixel patches (an 8 x 8 learned position grid); the resampler makes 4 rows a tile
TOWER = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, patch_size=4,
             image_size=32)
PERCEIVER = dict(hidden_size=64, resampler_n_latents=4, resampler_depth=2, resampler_n_heads=4, resampler_head_dim=8,
                 num_key_value_heads=2)
SEQ_LEN = 4
PROMPT = "USER: <image>The quick brown fox ASSISTANT:"
WITH_LOGPROBS = SamplingParams(max_tokens=8, temperature=0, logprobs=0)
KNOBS = dict(dtype="float32", max_seq_len=128, max_num_batched_tokens=16, page_size=4, num_pages=60, max_num_seqs=2,
             cpu_kernels=False)


def save_tiny_idefics2(path: Path) -> Path:
    """A random float32 Idefics2 (2-layer SigLIP tower, 2-layer resampler, 2-layer Mistral) with a tokenizer holding
    its marks and an image processor splitting images, saved as transformers 5.24 saves them."""
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": MARKS})
    tokenizer.save_pretrained(path)
    text = {**COMMON, "vocab_size": 320, "model_type": "mistral", "tie_word_embeddings": False}
    config = transformers.Idefics2Config(text_config=text, vision_config=TOWER, perceiver_config=PERCEIVER,
                                         image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                                         bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.Idefics2ForConditionalGeneration(config).eval()
    with torch.no_grad():  # a tower loud enough that images move the logits; norms and biases off their init
        for name, param in model.named_parameters():
            if "vision_model" in name or "connector" in name:
                param.mul_(4.0) if param.dim() > 1 else param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    transformers.Idefics2ImageProcessorPil(size={"shortest_edge": 8, "longest_edge": 32},
                                           do_image_splitting=True).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_idefics2(tmp_path_factory.mktemp("idefics2"))


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.Idefics2ForConditionalGeneration.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, **KNOBS)


def picture(seed: int, width: int, height: int) -> Image.Image:
    """A random image. Wide 50 x 36 becomes a 32 x 23 global tile (5 x 8 patches, the last row partial) and 25 x 18
    quarters (4 x 6 patches): tiles of three sizes in one call, padded and masked."""
    return Image.fromarray(random_image(seed, 56)).resize((width, height))


WIDE, TALL = (50, 36), (36, 50)


def hf_inputs(llm: LLM, images: list[Image.Image], text: str = PROMPT) -> dict:
    """HF's Idefics2Processor's inputs (its own text and pixels) for a prompt with its images."""
    processor = transformers.Idefics2Processor(llm.image_prompts.processor(), llm.tokenizer, image_seq_len=SEQ_LEN)
    out = processor(text=text, images=images, return_tensors="pt")
    return {k: out[k] for k in ("input_ids", "attention_mask", "pixel_values", "pixel_attention_mask")}


def test_layout_rows_and_logits_match_hf(llm, hf_model):
    """The prompt's ids are HF's processor's for a wide and a tall image (5 tiles each: 10 runs of 4 <image>); the
    tiles' rows within 1e-5 of HF's get_image_features; every position's float32 logits within 1e-5 of the
    largest."""
    images, text = [picture(0, *WIDE), picture(1, *TALL)], PROMPT.replace("<image>", "<image><image>")
    inputs = hf_inputs(llm, images, text)
    ids, tiles = llm.image_prompts.prompt(text, images, "test")
    assert ids == inputs["input_ids"][0].tolist()
    assert [t.length for t in tiles] == [SEQ_LEN] * 10 and all(
        set(ids[t.offset : t.offset + t.length]) == {llm.image_prompts.cfg.image_token_id} for t in tiles)
    with torch.no_grad():
        expected = hf_model(**inputs).logits[0].numpy()
        hf_rows = hf_model.get_image_features(pixel_values=inputs["pixel_values"],
                                              pixel_attention_mask=inputs["pixel_attention_mask"]).pooler_output[0]
    vision = llm.engine.runner.vision  # each image's 5 tiles in one tower call of 8, as the engine's requests make
    rows = np.concatenate(vision.encode(list(tiles[:5])) + vision.encode(list(tiles[5:])))
    assert np.abs(rows - hf_rows.numpy()).max() <= 1e-5 * np.abs(hf_rows.numpy()).max()
    placed, mask = np.zeros((len(ids), rows.shape[-1]), np.float32), np.zeros(len(ids), bool)
    for k, t in enumerate(tiles):
        placed[t.offset : t.offset + t.length], mask[t.offset : t.offset + t.length] = rows[4 * k : 4 * k + 4], True
    assert np.abs(our_logits(llm, np.asarray(ids), placed, mask) - expected).max() <= 1e-5 * np.abs(expected).max()


def hf_generate(hf_model, inputs: dict) -> tuple[list[int], np.ndarray]:
    """HF's greedy tokens and each one's logprob."""
    with torch.no_grad():
        out = hf_model.generate(**inputs, max_new_tokens=WITH_LOGPROBS.max_tokens, do_sample=False,
                                output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    return tokens, np.asarray([torch.log_softmax(s[0], -1)[t].item() for s, t in zip(out.scores, tokens)])


def test_engine_greedy_matches_hf(hf_model, llm):
    """Two image prompts batched through the engine: each one's greedy tokens and logprobs as HF's generate."""
    images = [picture(2, *WIDE), picture(3, *TALL)]
    outs = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": image}} for image in images],
                        WITH_LOGPROBS)
    for image, out in zip(images, outs):
        got = out.outputs[0]
        hf, hf_logprobs = hf_generate(hf_model, hf_inputs(llm, [image]))
        logprobs = np.asarray([step[t].logprob for step, t in zip(got.logprobs, got.token_ids)])
        assert got.token_ids == hf and np.abs(logprobs - hf_logprobs).max() <= 1e-4
    expanded = {"prompt_token_ids": hf_inputs(llm, images[:1])["input_ids"][0].tolist(),
                "multi_modal_data": {"image": images[0]}}  # HF's processor's ids run as they are
    assert llm.generate(expanded, WITH_LOGPROBS)[0].outputs[0].token_ids == outs[0].outputs[0].token_ids


def test_registry_and_refused_fields(model_dir):
    """Idefics2 runs its text_config's Mistral; a perceiver activation it cannot run is refused by name, and so are
    tiles larger than the tower's image_size."""
    hf = json.loads((model_dir / "config.json").read_text())
    assert "Idefics2ForConditionalGeneration" in SUPPORTED_ARCHITECTURES
    assert from_hf_config(hf) == from_hf_config({**hf["text_config"], "architectures": ["MistralForCausalLM"]})
    assert read_vision_language_config(hf).image_seq_len == SEQ_LEN
    bad = {**hf, "perceiver_config": {**hf["perceiver_config"], "hidden_act": "relu"}}
    with pytest.raises(ConfigError, match="perceiver_config.hidden_act 'relu'"):
        read_vision_language_config(bad)
    cfg = read_vision_language_config(hf)
    larger = transformers.Idefics2ImageProcessorPil(size={"shortest_edge": 8, "longest_edge": 64})
    with pytest.raises(ValueError, match="at most 32 x 32"):
        image_tiles(larger, picture(4, *WIDE), cfg, "test")
