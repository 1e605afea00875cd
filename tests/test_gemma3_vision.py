"""Gemma 3 with images against HF transformers on the same tiny weights and pixels: every position's logits
(image tokens attending to their whole image, on the sliding layer too), greedy tokens through the engine
with chunks that would cut an image moved before it, prefix caching on and off, and LLM.chat with a data URL."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from gemma3_vision_models import BOI, WINDOW, save_tiny_gemma3_vision
from PIL import Image
from test_llava import chat_message, image_prompt
from vision_models import random_image

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.paged import init_paged_cache
from jaxinfer.cache.ragged_view import RaggedPagedCache
from jaxinfer.checkpoint.loader import load_vision_weights
from jaxinfer.engine.scheduler import whole_image_count
from jaxinfer.entrypoints.multimodal import ImagePrompts
from jaxinfer.models import forward_with_taps, lm_logits
from jaxinfer.models.embed_override import EmbedOverride
from jaxinfer.models.gemma3_vision import read_gemma3_vision_config
from jaxinfer.models.vision_language import image_features
from jaxinfer.runtime.embed_rows import image_ends
from jaxinfer.runtime.image_input import ImageInput

PROMPT = f"USER: {BOI}The quick brown fox ASSISTANT:"  # text after the image: its bidirectional mask matters
GREEDY = SamplingParams(max_tokens=6, temperature=0)
WITH_LOGPROBS = SamplingParams(max_tokens=6, temperature=0, logprobs=0)
# 12 tokens a step: the image's 4 tokens (from position 9) would be cut at 12, so the first chunk ends at 9
KNOBS = dict(dtype="float32", max_seq_len=128, max_num_batched_tokens=12, page_size=4, num_pages=40, max_num_seqs=2,
             limit_mm_per_prompt={"image": 2})


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory):
    return save_tiny_gemma3_vision(tmp_path_factory.mktemp("gemma3v"))


@pytest.fixture(scope="module")
def hf_gemma3(gemma3_dir):
    return transformers.Gemma3ForConditionalGeneration.from_pretrained(gemma3_dir).eval()


@pytest.fixture(scope="module")
def llm(gemma3_dir):
    return LLM(gemma3_dir, **KNOBS)


def hf_inputs(llm: LLM, image: np.ndarray, text: str = PROMPT) -> dict:
    """HF's inputs for the prompt as our processor expands it: ids, pixels and token_type_ids (1 at image tokens,
    what turns on HF's bidirectional image mask)."""
    ids, images = llm.image_prompts.prompt(text, [Image.fromarray(image)], "test")
    ids = torch.tensor([ids])
    return dict(input_ids=ids, pixel_values=torch.tensor(images[0].pixels[None]),
                token_type_ids=(ids == llm.image_prompts.cfg.image_token_id).long())


def hf_greedy(hf_gemma3, llm: LLM, image: np.ndarray, text: str = PROMPT) -> list[int]:
    return hf_greedy_logprobs(hf_gemma3, llm, image, text)[0]


def hf_greedy_logprobs(hf_gemma3, llm: LLM, image: np.ndarray, text: str = PROMPT) -> tuple[list[int], np.ndarray]:
    """HF's greedy tokens and each one's logprob."""
    return hf_generate(hf_gemma3, hf_inputs(llm, image, text))


def hf_generate(hf_gemma3, inputs: dict) -> tuple[list[int], np.ndarray]:
    """HF's greedy tokens and each one's logprob for its inputs."""
    with torch.no_grad():
        out = hf_gemma3.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True)
    tokens = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    logprobs = [torch.log_softmax(score[0], -1)[t].item() for score, t in zip(out.scores, tokens)]
    return tokens, np.asarray(logprobs)


def greedy_logprobs(llm: LLM, image: np.ndarray | list[np.ndarray], text: str = PROMPT
                    ) -> tuple[list[int], np.ndarray]:
    """Our greedy tokens and each one's logprob."""
    out = llm.generate(image_prompt(image, text), WITH_LOGPROBS)[0].outputs[0]
    return out.token_ids, np.asarray([step[t].logprob for step, t in zip(out.logprobs, out.token_ids)])


def our_logits(llm: LLM, ids: list[int], rows: np.ndarray, image, key_ends: bool) -> np.ndarray:
    """Every position's logits through the ragged step's attention (one row, the image's rows placed);
    key_ends False: image tokens attend causally only (what must not match HF)."""
    cfg = llm.image_prompts.cfg
    placed = np.zeros((len(ids), cfg.text_hidden_size), np.float32)
    placed[image.offset : image.offset + image.length] = rows
    ends = np.zeros(len(ids), np.int32)
    ends[image.offset : image.offset + image.length] = image_ends((image,))
    pages = init_paged_cache(llm.config, 1, 128, np.float32, page_size=4)
    view = RaggedPagedCache(pages, np.zeros(len(ids), np.int32), ends if key_ends else None)
    override = EmbedOverride(placed, np.asarray(ids) == cfg.image_token_id)
    positions = np.arange(len(ids), dtype=np.int32)[None]
    hidden, _, _ = forward_with_taps(llm.weights, np.asarray([ids]), positions, view, llm.config, (), override)
    return np.asarray(lm_logits(llm.weights, hidden))[0]


def test_logits_match_hf(gemma3_dir, hf_gemma3, llm):
    """Every position's float32 logits, with text after the image: HF's only with image tokens seeing their whole
    image (on the sliding layer, window 3 < the image's 4 tokens, too); causal image tokens differ."""
    cfg = read_gemma3_vision_config(json.loads((gemma3_dir / "config.json").read_text()))
    inputs = hf_inputs(llm, random_image(0))
    ids = inputs["input_ids"][0].tolist()
    _, (image,) = llm.image_prompts.prompt(PROMPT, [Image.fromarray(random_image(0))], "test")
    with torch.no_grad():
        expected = hf_gemma3(**inputs).logits[0].numpy()
        hf_rows = hf_gemma3.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output[0].numpy()
    rows = np.asarray(image_features(load_vision_weights(gemma3_dir, cfg, np.float32), image.pixels[None], cfg))[0]
    assert rows.shape == (4, 64) and np.abs(rows - hf_rows).max() <= 1e-5 * np.abs(hf_rows).max()
    assert llm.config.layer_windows == (WINDOW, 0) and image.length > WINDOW
    got = our_logits(llm, ids, rows, image, key_ends=True)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    causal = our_logits(llm, ids, rows, image, key_ends=False)
    assert np.abs(causal - expected).max() > 1e-2 * np.abs(expected).max()


def test_prompt_expansion_as_hf_processor(llm, gemma3_dir):
    """The start-of-image mark becomes HF's full image sequence (text and token-id prompts alike)."""
    tokenizer = llm.image_prompts.tokenizer
    ids, (image,) = llm.image_prompts.prompt(PROMPT, [Image.fromarray(random_image(0))], "test")
    sequence = "\n\n" + BOI + "<image_soft_token>" * 4 + "<end_of_image>\n\n"
    assert ids == tokenizer.encode(PROMPT.replace(BOI, sequence))
    assert (image.offset, image.length) == (ids.index(llm.image_prompts.cfg.image_token_id), 4)
    marked = tokenizer.encode(PROMPT)
    spliced, _ = llm.image_prompts.prompt(marked, [Image.fromarray(random_image(0))], "test")
    assert spliced.count(llm.image_prompts.cfg.image_token_id) == 4 and spliced[-3:] == ids[-3:]


def test_whole_image_chunks():
    """A chunk ends before an image it would cut; one starting inside an image holds its rest or waits."""
    images = (image_at(6, 4),)
    assert whole_image_count(images, 0, 8) == 6  # would cut [6, 10): ends at 6
    assert whole_image_count(images, 0, 10) == 10 and whole_image_count(images, 6, 8) == 8
    assert whole_image_count(images, 8, 1) == 0  # starts inside (a prefix hit), cannot hold the rest: waits


def image_at(offset: int, length: int) -> ImageInput:
    return ImageInput.of(offset, length, np.zeros((3, 2, 2), np.float32))


@pytest.mark.parametrize("caching", [True, False], ids=["prefix-cache", "no-prefix-cache"])
def test_engine_greedy_matches_hf(gemma3_dir, hf_gemma3, llm, caching):
    """Greedy tokens through the engine as HF's, the 12-token first chunk moved off the image; another image gives other
    tokens; a rerun hits the cache (its image's pages too)."""
    llm = llm if caching else LLM(gemma3_dir, enable_prefix_caching=False, **KNOBS)
    a, b = random_image(0), random_image(1)
    (out_a, logprobs_a), (out_b, _) = greedy_logprobs(llm, a), greedy_logprobs(llm, b)
    hits = llm.engine.scheduler.prefix_hits
    again = llm.generate(image_prompt(a, PROMPT), GREEDY)[0].outputs[0].token_ids
    hf_a, hf_logprobs_a = hf_greedy_logprobs(hf_gemma3, llm, a)
    assert out_a == hf_a and out_b == hf_greedy(hf_gemma3, llm, b)
    assert np.abs(logprobs_a - hf_logprobs_a).max() <= 1e-4  # a chunk cutting the image reads unwritten keys
    assert out_a != out_b and again == out_a
    assert (llm.engine.scheduler.prefix_hits > hits) == caching


def test_two_images_see_their_own(llm, hf_gemma3):
    """Two images in one prompt: each image's tokens see their own image whole, not the other's (HF's block ids)."""
    a, b = random_image(2), random_image(3)
    two = f"USER: {BOI}{BOI}The quick ASSISTANT:"
    ids, images = llm.image_prompts.prompt(two, [Image.fromarray(a), Image.fromarray(b)], "test")
    assert [i.length for i in images] == [4, 4]
    assert images[1].offset - images[0].offset == 10  # 4 image tokens, eoi, 4 x "\n", boi
    inputs = torch.tensor([ids])
    hf, hf_logprobs = hf_generate(hf_gemma3, dict(
        input_ids=inputs, pixel_values=torch.tensor(np.stack([i.pixels for i in images])),
        token_type_ids=(inputs == llm.image_prompts.cfg.image_token_id).long()))
    out, logprobs = greedy_logprobs(llm, [a, b], two)
    assert out == hf and np.abs(logprobs - hf_logprobs).max() <= 1e-4


def test_image_longer_than_a_step_refused(gemma3_dir, llm):
    with pytest.raises(ValueError, match="max_num_batched_tokens 3.*both ways"):
        LLM(gemma3_dir, **{**KNOBS, "max_num_batched_tokens": 3}).generate(image_prompt(random_image(0), PROMPT))
    # the all-positions pass attends causally only (LLaVA's images take prompt_logprobs)
    with pytest.raises(ValueError, match="prompt_logprobs is not served with images on this model"):
        llm.generate(image_prompt(random_image(0), PROMPT), SamplingParams(max_tokens=1, prompt_logprobs=1))


def test_pan_and_scan_refused(llm, gemma3_dir, tmp_path):
    """Gemma 3's pan-and-scan crops (several pixel sets per image) are refused by their field."""
    config = json.loads((gemma3_dir / "preprocessor_config.json").read_text())
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**config, "do_pan_and_scan": True}))
    prompts = ImagePrompts(tmp_path, llm.image_prompts.cfg, llm.image_prompts.tokenizer, 2)
    with pytest.raises(ValueError, match="do_pan_and_scan true is not supported"):
        prompts.prompt(PROMPT, [Image.fromarray(random_image(0))], "test")


def test_chat_with_image_url(llm, hf_gemma3):
    """LLM.chat reads a data: URL image part; the reply is HF's greedy reply to the rendered prompt."""
    image = random_image(4)
    (out,) = llm.chat(chat_message(image), GREEDY)
    assert out.prompt.count(BOI) == 1
    assert out.outputs[0].token_ids == hf_greedy(hf_gemma3, llm, image, out.prompt)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_ragged_step_with_image_ends_lowers_for_the_accelerators(llm, platform):
    """The widest ragged step, its image rows carrying key ends, lowers for CUDA and TPU (no accelerator here)."""
    from accelerator_programs import EXPORT_PLATFORMS, step_programs
    from jax import export

    runner = llm.engine.runner
    try:
        ragged = [(program, args, kwargs) for shape, program, args, kwargs in step_programs(llm, platform)
                  if shape[0] == "ragged"]
        program, args, kwargs = ragged[-1]
        assert kwargs["images"].key_ends is not None
        export.export(program, platforms=(EXPORT_PLATFORMS[platform],))(*args, **kwargs)
    finally:
        runner.branchless, runner.stop_early = False, True
