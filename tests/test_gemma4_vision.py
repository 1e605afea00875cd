"""Gemma 4 with images (Gemma4ForConditionalGeneration's vision tower) against transformers on the same tiny saved
weights: the tower's rows of two image sizes sharing one padded program, every position's float32 logits of an
image prompt (an image's tokens seeing each other on the sliding layers only), the engine's greedy tokens."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
import torch
import transformers
from hf_models import COMMON, GEMMA4, save_tiny_tokenizer
from PIL import Image
from vision_models import random_image

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.paged import init_paged_cache
from jaxinfer.cache.ragged_view import RaggedPagedCache
from jaxinfer.checkpoint.hf_import import auto_image_processor
from jaxinfer.models import forward_with_taps, lm_logits
from jaxinfer.models.embed_override import EmbedOverride
from jaxinfer.runtime.embed_rows import image_ends

BOI, IMAGE, EOI = "<boi>", "<|image|>", "<eoi>"
PROMPT = f"A {IMAGE} fox jumps"  # text after the image: its tokens' mask matters; 78 tokens expanded
# 4-pixel patches pooled 2 x 2, at most 70 rows an image: a square image becomes 64 x 64 pixels (8 x 8 rows), a
# 2:1 one 88 x 40 (11 x 5 rows); both pad to the 64-row bucket
TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             head_dim=16, patch_size=4, pooling_kernel_size=2, position_embedding_size=32, standardize=True,
             use_clipped_linears=True)
# A sliding layer (window 8, shorter than an image) and a global one, per-layer inputs (an image token's read as the
# pad's), over a vocabulary holding the image tokens
TEXT = dict(layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=8, vocab_size=320,
            vocab_size_per_layer_input=320, use_bidirectional_attention="vision")
# 80 tokens a step: the whole prompt in one chunk (one ragged program)
KNOBS = dict(dtype="float32", max_seq_len=128, max_num_batched_tokens=80, max_num_seqs=1)


def save_tiny_gemma4(path: Path) -> Path:
    """A random float32 Gemma 4 (a 2-layer language model, image tokens bidirectional on its sliding layer; a 2-layer
    tower, one kv head, standardized, its linears clipped) with a tokenizer holding the image tokens and its image
    processor."""
    save_tiny_tokenizer(path, vocab_size=240)  # 259 tokens (the byte alphabet's 256 and 3 specials) and 3 below 320
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": [BOI, IMAGE, EOI]})
    tokenizer.save_pretrained(path)
    text = transformers.Gemma4TextConfig(**{**COMMON, **GEMMA4, **TEXT})
    ids = tokenizer.convert_tokens_to_ids([BOI, IMAGE, EOI])
    config = transformers.Gemma4Config(text_config=text, vision_config=transformers.Gemma4VisionConfig(**TOWER),
                                       boi_token_id=ids[0], image_token_id=ids[1], eoi_token_id=ids[2])
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(config).eval()
    with torch.no_grad():  # a tower loud enough that images move the logits; norms and standardization off init
        for name, param in model.named_parameters():
            if "vision" in name:
                param.mul_(4.0) if param.dim() > 1 else param.add_(0.1 * torch.randn_like(param))
        for name, buffer in model.named_buffers():
            if "std_" in name:
                buffer.copy_(torch.randn_like(buffer) * 0.1 + (1.0 if "scale" in name else 0.0))
            if name.endswith(("_min", "_max")):  # clip ranges the activations reach (outputs ~0.5 in scale)
                bound = (0.4 if "output" in name else 1.5) + 0.4 * torch.rand(())
                buffer.copy_(-bound if name.endswith("_min") else bound)
    model.save_pretrained(path)
    transformers.Gemma4ImageProcessorPil(patch_size=4, max_soft_tokens=70, pooling_kernel_size=2).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_gemma4(tmp_path_factory.mktemp("gemma4_vision"))


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.Gemma4ForConditionalGeneration.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, **KNOBS)


def picture(seed: int, width: int = 40, height: int = 40) -> Image.Image:
    return Image.fromarray(random_image(seed, 40)).resize((width, height))


def hf_inputs(llm: LLM, images: list[Image.Image], ids: list[int]) -> dict:
    """HF's inputs: our expanded ids, the pixels and positions of HF's own image processor, the image tokens' types."""
    made = auto_image_processor().from_pretrained(llm.image_prompts.model_dir)(images, return_tensors="pt")
    types = (torch.tensor([ids]) == llm.image_prompts.cfg.image_token_id).long()
    return dict(input_ids=torch.tensor([ids]), pixel_values=made["pixel_values"],
                image_position_ids=made["image_position_ids"], mm_token_type_ids=types)


def hf_greedy(hf_model, inputs: dict, steps: int) -> list[int]:
    """HF's greedy tokens, each step a whole forward (the image tokens' mask as the processor gives it)."""
    ids, types, out = inputs["input_ids"], inputs["mm_token_type_ids"], []
    for _ in range(steps):
        with torch.no_grad():
            logits = hf_model(**{**inputs, "input_ids": ids, "mm_token_type_ids": types}).logits[0, -1]
        out.append(int(logits.argmax()))
        ids, types = torch.cat([ids, torch.tensor([[out[-1]]])], 1), torch.cat([types, torch.zeros(1, 1).long()], 1)
    return out


def our_logits(llm: LLM, ids: list[int], rows: np.ndarray, image, both_ways: bool) -> np.ndarray:
    """Every position's logits through the ragged step's attention (one jitted program), the image's rows placed;
    both_ways False: image tokens attend causally only (their key ends 0: what must not match HF)."""
    placed, ends = np.zeros((len(ids), rows.shape[-1]), np.float32), np.zeros(len(ids), np.int32)
    placed[image.offset : image.offset + image.length] = rows
    if both_ways:
        ends[image.offset : image.offset + image.length] = image_ends((image,))
    view = RaggedPagedCache(init_paged_cache(llm.config, 1, 128, np.float32, page_size=4), np.zeros(len(ids), np.int32),
                            ends)
    override = EmbedOverride(placed, np.asarray(ids) == llm.image_prompts.cfg.image_token_id)

    def logits(weights, tokens, positions, view, override):
        hidden, _, _ = forward_with_taps(weights, tokens, positions, view, llm.config, (), override)
        return lm_logits(weights, hidden)

    positions = np.arange(len(ids), dtype=np.int32)[None]
    return np.asarray(jax.jit(logits)(llm.weights, np.asarray([ids]), positions, view, override))[0]


def test_tower_rows_match_hf_and_two_sizes_share_a_program(llm, hf_model):
    """A square and a 2:1 image (64 and 55 rows, HF's processor's counts) expand to <boi>, their rows' image tokens,
    <eoi>; both pad to one tower program (an image of the processor's 70 rows to 70, not the 96 bucket); their rows
    are HF's get_image_features' within 1e-5 of the largest."""
    vision, cfg = llm.engine.runner.vision, llm.image_prompts.cfg
    images = [picture(0), picture(1, 80, 40)]
    ids, carried = llm.image_prompts.prompt(f"{IMAGE} and {IMAGE}", images, "test")
    assert [i.length for i in carried] == [64, 55]
    for image in carried:
        assert ids[image.offset - 1] == cfg.boi_token_id and ids[image.offset + image.length] == cfg.eoi_token_id
    shapes = [jax.tree.map(np.shape, vision.program(i.pixels).args[1]) for i in carried]
    assert shapes[0] == shapes[1]
    (largest,) = llm.image_prompts.prompt(IMAGE, [picture(5, 50, 35)], "test")[1]  # 10 x 7 rows: the processor's 70
    assert largest.length == 70 and vision.program(largest.pixels).args[1].pixels.shape[1] == 70 * 4  # not 96's
    inputs = hf_inputs(llm, images, ids)
    with torch.no_grad():
        hf_rows = hf_model.model.get_image_features(inputs["pixel_values"], inputs["image_position_ids"]).pooler_output
    for image, expected in zip(carried, hf_rows):
        expected = expected.numpy()
        assert np.abs(vision.features(image) - expected).max() <= 1e-5 * np.abs(expected).max()


def test_image_prompt_logits_match_hf(llm, hf_model):
    """Every position's float32 logits of a prompt with text after the image within 1e-5 of the largest (its tokens
    see each other on the sliding layers, causally on the global ones); attending causally only misses by more."""
    image = picture(2)
    ids, (carried,) = llm.image_prompts.prompt(PROMPT, [image], "test")
    with torch.no_grad():
        expected = hf_model(**hf_inputs(llm, [image], ids)).logits[0].numpy()
    rows = llm.engine.runner.vision.features(carried)
    got = our_logits(llm, ids, rows, carried, both_ways=True)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    causal = our_logits(llm, ids, rows, carried, both_ways=False)
    assert np.abs(causal - expected).max() > 1e-3 * np.abs(expected).max()


def test_engine_greedy_matches_hf(llm, hf_model):
    """Greedy tokens through the engine (the image whole in one chunk) are HF's."""
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    out = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": picture(3)}}, greedy)[0].outputs[0]
    ids, _ = llm.image_prompts.prompt(PROMPT, [picture(3)], "test")
    assert out.token_ids == hf_greedy(hf_model, hf_inputs(llm, [picture(3)], ids), 6)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_tower_program_lowers_for_the_accelerators(llm, platform):
    """The tower's program over an image's patches padded to a bucket lowers for CUDA and TPU (no accelerator here)."""
    from accelerator_programs import EXPORT_PLATFORMS
    from jax import export

    tower = llm.engine.runner.vision.program(np.zeros((3, 64, 64), np.float32))
    export.export(tower.function, platforms=(EXPORT_PLATFORMS[platform],))(*tower.args, **tower.kwargs)
