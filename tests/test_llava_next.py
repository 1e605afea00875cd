"""LLaVA-NeXT (a CLIP tower, a Llama) and LLaVA-OneVision (a SigLIP tower, a Qwen2) against HF transformers on the
same tiny weights: the placeholder counts against HF's processors, every position's float32 logits of prompts with
images of two aspect ratios (other tile grids, crops and, for OneVision, a bilinear resize), greedy tokens through the
engine, and what they cannot run refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from hf_models import COMMON, hf, save_tiny_tokenizer
from PIL import Image
from test_internvl import KNOBS as INTERNVL_KNOBS
from test_llava import KNOBS as LLAVA_KNOBS
from test_llava import chat_message, data_url
from vision_models import TOWER, random_image

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.model import ConfigError
from jaxinfer.entrypoints.chat_template import render_conversations
from jaxinfer.entrypoints.multimodal import chat_prompts
from jaxinfer.models.registry import SUPPORTED_ARCHITECTURES, from_hf_config
from jaxinfer.models.vision_language import read_vision_language_config
from jaxinfer.runtime.prompt_logprobs import all_position_logits

PROMPT = "USER: <image>\nThe quick brown fox ASSISTANT:"
SHORT = "USER: <image>\nThe fox"  # within test_llava's KNOBS' 96 tokens with its 56 placeholders
GREEDY = SamplingParams(max_tokens=6, temperature=0)
# 32-pixel tiles of 8-pixel patches: 16 rows a tile. NeXT's grids up to 2 x 2 tiles; OneVision's up to 1 x 3, and
# anyres_max_1: a grid of more than one tile's patches (x 1.1^2) is resized down bilinearly
NEXT_PINS = [[32, 64], [64, 32], [64, 64]]
ONEVISION_PINS = [[32, 32], [32, 64], [64, 32], [64, 64], [32, 96], [96, 32]]
FAMILIES = {
    "next": (hf.LlavaNextForConditionalGeneration, hf.LlavaNextImageProcessorPil, NEXT_PINS),
    "onevision": (hf.LlavaOnevisionForConditionalGeneration, hf.LlavaOnevisionImageProcessorPil, ONEVISION_PINS),
}
# Engines as test_llava's (a Llama as NeXT's) and test_internvl's (a Qwen2 as OneVision's) run theirs: the same
# programs, compiled once a session
KNOBS = {"next": LLAVA_KNOBS, "onevision": INTERNVL_KNOBS}
# SigLIP's rows reach the hundreds with these loud weights; the tower's float32 rounding alone is 9e-6 of the largest
TOLERANCE = {"next": 1e-5, "onevision": 3e-5}
# (width, height): wide and tall (NeXT: 1 x 2 and 2 x 1 tiles, OneVision: 1 x 3 and 3 x 1; crops of rows, columns)
SIZES = [(96, 40), (30, 80)]


def hf_config(family: str, image_token_id: int) -> transformers.PretrainedConfig:
    """A tiny NeXT (CLIP, Llama) or OneVision (SigLIP, Qwen2) config."""
    if family == "next":
        vision, text = transformers.CLIPVisionConfig(**TOWER, projection_dim=32), transformers.LlamaConfig(**COMMON)
        return hf.LlavaNextConfig(vision_config=vision, text_config=text, image_token_index=image_token_id,
                                  image_grid_pinpoints=NEXT_PINS, image_seq_length=16)
    vision = transformers.SiglipVisionConfig(**TOWER)
    text = transformers.Qwen2Config(**{**COMMON, "tie_word_embeddings": False})
    return hf.LlavaOnevisionConfig(vision_config=vision, text_config=text, image_token_index=image_token_id,
                                   video_token_index=image_token_id + 1, image_grid_pinpoints=ONEVISION_PINS,
                                   vision_aspect_ratio="anyres_max_1")


def save_tiny(path: Path, family: str) -> Path:
    """A random float32 checkpoint of the family with its tokenizer (`<image>`, `<video>`) and image processor."""
    model_class, processor_class, pins = FAMILIES[family]
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>", "<video>"]})
    tokenizer.save_pretrained(path)
    config = hf_config(family, tokenizer.convert_tokens_to_ids("<image>"))
    config.text_config.vocab_size = 320
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():  # a tower and projector loud enough that images move the logits
        for name, param in model.named_parameters():
            if "vision_tower" in name or "projector" in name:
                param.mul_(4.0) if param.dim() > 1 else param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    processor_class(size={"height": 32, "width": 32} if family == "onevision" else {"shortest_edge": 32},
                    crop_size={"height": 32, "width": 32}, image_grid_pinpoints=pins).save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, checkpoint, HF model, LLM) of each family."""
    path = save_tiny(tmp_path_factory.mktemp(request.param), request.param)
    model = FAMILIES[request.param][0].from_pretrained(path).eval()
    return request.param, path, model, LLM(path, **KNOBS[request.param])


def picture(seed: int, size: tuple[int, int]) -> Image.Image:
    return Image.fromarray(random_image(seed, 56)).resize(size)


class OnevisionProcessor(transformers.LlavaOnevisionProcessor):
    """HF's LlavaOnevisionProcessor without a video processor (its class needs torchvision, absent here)."""

    def check_argument_for_proper_class(self, name, argument):
        return None if argument is None else super().check_argument_for_proper_class(name, argument)


def hf_inputs(name: str, llm: LLM, images: list[Image.Image], text: str = PROMPT) -> dict:
    """HF's processor's inputs for the prompt (its own placeholder counts and tiles)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(llm.model_dir)
    image_processor = llm.image_prompts.processor()
    if name == "next":
        processor = transformers.LlavaNextProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                                    patch_size=8, vision_feature_select_strategy="default",
                                                    num_additional_image_tokens=1)
    else:
        processor = OnevisionProcessor(image_processor=image_processor, tokenizer=tokenizer, num_image_tokens=16,
                                       vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_1")
    return dict(processor(text=text, images=images, return_tensors="pt"))


def engine_logits(llm: LLM, ids: list[int], images: tuple) -> np.ndarray:
    """Every position's float32 logits through the engine's all-positions program (prompt logprobs'), the images'
    rows laid out by its vision runner."""
    rows = llm.engine.runner.vision.prompt_rows(len(ids), images)
    return all_position_logits(llm._engine_weights, llm.config, ids, np.float32, llm.max_seq_len,
                               run=llm.engine.runner.executables, rows=rows)


def test_placeholders_rows_and_logits_match_hf(family):
    """A wide and a tall image, each alone in a prompt: the ids are HF's processor's (its token count), and every
    position's float32 logits through the engine's all-positions pass are HF's on the same pixels (within 1e-5 of
    the largest; OneVision's 3e-5); HF's expanded ids run as they are; two images in one prompt take HF's counts too
    (each tiled, as HF's processors tile a prompt's images)."""
    name, _, model, llm = family
    for seed, size in enumerate(SIZES):
        image = picture(seed, size)
        inputs = hf_inputs(name, llm, [image])
        ids, (carried,) = llm.image_prompts.prompt(PROMPT, [image], "test")
        assert ids == inputs["input_ids"][0].tolist()
        again, (same,) = llm.image_prompts.prompt(ids, [image], "test")  # HF's expanded ids run as they are
        assert again == ids and (same.offset, same.length, same.content_hash) == \
            (carried.offset, carried.length, carried.content_hash)
        with torch.no_grad():
            expected = model(**inputs).logits[0].numpy()
        got = engine_logits(llm, ids, (carried,))
        assert np.abs(got - expected).max() <= TOLERANCE[name] * np.abs(expected).max()
    two = [picture(5, SIZES[0]), picture(6, SIZES[1])]
    text = "USER: <image> and <image>\nThe quick ASSISTANT:"
    assert llm.image_prompts.prompt(text, two, "test")[0] == hf_inputs(name, llm, two, text)["input_ids"][0].tolist()


@pytest.mark.parametrize("family", ["next"], indirect=True)  # OneVision's steps are the same; its rows tested above
def test_engine_greedy_matches_hf(family):
    """One image prompt through the engine (16-token chunks cut its placeholders) gives HF generate's tokens."""
    name, _, model, llm = family
    image = picture(7, SIZES[1])
    (out,) = llm.generate({"prompt": SHORT, "multi_modal_data": {"image": image}}, GREEDY)
    inputs = hf_inputs(name, llm, [image], SHORT)
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False)
    assert out.outputs[0].token_ids == expected[0, inputs["input_ids"].shape[1]:].tolist()


@pytest.mark.parametrize("family", ["next"], indirect=True)  # the rendering is the family's tokenizer's, not its tower
def test_chat_through_a_typed_template(family):
    """LLM.chat through a template that loops over typed parts (llava-hf's; "auto" finds it): the user's text and
    one image mark, as HF's apply_chat_template renders typed parts, and the ids HF's processor makes of them (the
    template's mark expanded as a prompt's)."""
    name, _, _, llm = family
    image = picture(7, SIZES[1])
    # the text first: the template puts the image before it, which only an image part (not mark text) lets it do
    messages = [{"role": "user", "content": [{"type": "text", "text": "The fox"},
                                             {"type": "image_url", "image_url": {"url": data_url(np.asarray(image))}}]}]
    (out,) = llm.chat(messages, SamplingParams(max_tokens=1, temperature=0), chat_template=TYPED_TEMPLATE)
    typed = [{"role": "user", "content": [{"type": "text", "text": "The fox"}, {"type": "image"}]}]
    assert out.prompt == llm.get_tokenizer().apply_chat_template(typed, chat_template=TYPED_TEMPLATE, tokenize=False)
    assert out.prompt == "USER: <image>\nThe fox ASSISTANT:"
    assert out.prompt_token_ids == hf_inputs(name, llm, [image], out.prompt)["input_ids"][0].tolist()
    with pytest.raises(ValueError, match="chat_template_content_format 'text' is not supported; accepted: auto"):
        llm.chat(messages, chat_template=TYPED_TEMPLATE, chat_template_content_format="text")


def test_unsupported_fields_and_videos_refused(family):
    """Strategies that give a tile other than its patch grid, a bad grid or aspect ratio, OneVision's videos."""
    name, path, _, llm = family
    config = json.loads((path / "config.json").read_text())
    wrong = "full" if name == "next" else "default"
    bad = [("vision_feature_select_strategy", wrong, "supported: '" + ("default" if name == "next" else "full")),
           ("image_grid_pinpoints", [[32, 40]], "multiple of vision_config.image_size 32")]
    bad += [("vision_aspect_ratio", "pad", "'anyres_max_N'")] if name == "onevision" else []
    for field, value, accepted in bad:
        with pytest.raises(ConfigError, match=f"{field} .*{accepted}"):
            read_vision_language_config({**config, field: value})
    assert config["architectures"][0] in SUPPORTED_ARCHITECTURES
    assert from_hf_config(config) == from_hf_config(llava_text_config(config))
    if name == "onevision":
        with pytest.raises(ValueError, match="video token .*videos are not supported"):
            llm.generate({"prompt": "<video>" + PROMPT, "multi_modal_data": {"image": picture(0, SIZES[0])}}, GREEDY)
        with pytest.raises(ValueError, match=r"served modalities are \('image',\), got \['video'\]"):
            llm.generate({"prompt": PROMPT, "multi_modal_data": {"video": [picture(0, SIZES[0])]}}, GREEDY)


def llava_text_config(config: dict) -> dict:
    """The checkpoint's text_config as its causal LM's own config."""
    text = config["text_config"]
    return {**text, "architectures": ["LlamaForCausalLM" if text["model_type"] == "llama" else "Qwen2ForCausalLM"]}


# llava-hf's NeXT template (OneVision's renders images the same way) over typed parts: an image as `<image>\n`
TYPED_TEMPLATE = ("{% for message in messages %}{{ message['role'].upper() + ': ' }}"
                  "{% for c in message['content'] | selectattr('type', 'equalto', 'image') %}"
                  "{{ '<image>\\n' }}{% endfor %}"
                  "{% for c in message['content'] | selectattr('type', 'equalto', 'text') %}{{ c['text'] }}{% endfor %}"
                  "{% endfor %}{{ ' ASSISTANT:' }}")
# the same template over string contents (as LLM.chat renders them: vLLM's "string" content format)
STRING_TEMPLATE = "{% for message in messages %}{{ message['role'].upper() + ': ' + message['content'] }}{% endfor %}" \
                  "{{ ' ASSISTANT:' }}"


def test_chat_image_part_renders_as_hf_template(family):
    """LLM.chat's image_url part becomes `<image>\\n` before the text, as the checkpoints' template renders an image
    part (and vLLM joins a mark to its text): the prompt HF's processor builds, not `<image>` glued to the text."""
    _, _, _, llm = family
    messages, (images,) = chat_prompts(chat_message(random_image(4)), llm.image_prompts)
    (ours,) = render_conversations(llm.get_tokenizer(), messages, STRING_TEMPLATE, True, None, None)
    typed = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "The quick brown fox"}]}]
    assert len(images) == 1
    assert ours == llm.get_tokenizer().apply_chat_template(typed, chat_template=TYPED_TEMPLATE, tokenize=False)
