"""InternVL (an InternViT tower, pixel shuffle, the LayerNorm-MLP projector, a Qwen2) against HF transformers on the
same tiny weights: the prompt layout against HF's InternVLProcessor (tiles by aspect ratio plus the thumbnail), the
tiles' rows against get_image_features, every position's float32 logits of a two-image prompt, greedy tokens through
the engine, a batch of image and text prompts with chunked prefill as each alone, the tower's variants (RMSNorm,
q/k norms, no q/k/v bias, a final LayerNorm, an earlier feature layer), LLM.chat, videos refused, the registry."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
import transformers
from hf_models import COMMON, save_tiny_tokenizer
from PIL import Image
from test_llava import chat_message
from test_pixtral import our_logits
from vision_models import random_image

from jaxinfer import LLM, SamplingParams
from jaxinfer.checkpoint.loader import load_vision_weights
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import SUPPORTED_ARCHITECTURES, from_hf_config
from jaxinfer.models.vision_language import image_features, read_vision_language_config

MARKS = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
         "video_token": "<video>"}
# 32-pixel tiles of 4x4 patches, shuffled 2x2: 4 <IMG_CONTEXT> rows a tile; up to 6 tiles plus the thumbnail
TOWER = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
             image_size=32, attention_bias=True)
SEQ_LEN = 4
CHAT_TEMPLATE = (  # an image part renders as <IMG_CONTEXT> and a newline, as InternVL's HF template writes it
    "{% for m in messages %}{{ m['role'] | upper }}: {% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<IMG_CONTEXT>\n{% else %}{{ p['text'] }}"
    "{% endif %}{% endfor %}{% endif %} {% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
TWO = "USER: <IMG_CONTEXT>\nThe quick <IMG_CONTEXT> brown fox ASSISTANT:"
GREEDY = SamplingParams(max_tokens=8, temperature=0)
# 16 tokens a step: the two images' 7 + 3 tiles (44 rows) are cut across chunks mid-tile
KNOBS = dict(dtype="float32", max_seq_len=128, max_num_batched_tokens=16, page_size=4, num_pages=96, max_num_seqs=4,
             cpu_kernels=False)


def save_tiny_internvl(path: Path, **tower: object) -> Path:
    """A random float32 InternVL (2-layer InternViT, 2-layer Qwen2) with a tokenizer holding its marks and an image
    processor, saved as transformers 5.24 saves them; `tower` overrides vision_config fields."""
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": list(MARKS.values())})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    text = {**COMMON, "vocab_size": 320, "model_type": "qwen2", "tie_word_embeddings": False}
    vision = {**TOWER, **{k: v for k, v in tower.items() if k != "vision_feature_layer"}}
    config = transformers.InternVLConfig(text_config=text, vision_config=vision, image_seq_length=SEQ_LEN,
                                         image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
                                         vision_feature_layer=tower.get("vision_feature_layer", -1),
                                         tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.InternVLForConditionalGeneration(config).eval()
    with torch.no_grad():  # a tower loud enough that images move the logits; norms, layer scales, biases off init
        for name, param in model.named_parameters():
            if name.endswith(("cls_token", "position_embeddings")):  # zeros at init
                param.copy_(torch.randn_like(param))
            elif "vision_tower" in name or "multi_modal_projector" in name:
                param.mul_(4.0) if param.dim() > 1 else param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    transformers.GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, max_patches=6).save_pretrained(path)
    return path


class HFProcessor(transformers.InternVLProcessor):
    """HF's InternVLProcessor without a video processor (its class needs torchvision, absent here)."""

    def check_argument_for_proper_class(self, name, argument):
        return None if argument is None else super().check_argument_for_proper_class(name, argument)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_internvl(tmp_path_factory.mktemp("internvl"))


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.InternVLForConditionalGeneration.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, **KNOBS)


def picture(seed: int, width: int = 80, height: int = 48) -> Image.Image:
    """A random image; 80 x 48 takes a 3 x 2 grid of tiles (6) and the thumbnail, 64 x 32 a 2 x 1 grid and it."""
    return Image.fromarray(random_image(seed, 56)).resize((width, height))


def images_of(seed: int) -> list[Image.Image]:
    return [picture(seed), picture(seed + 1, 64, 32)]


def hf_inputs(llm: LLM, images: list[Image.Image], text: str = TWO) -> dict:
    """HF's InternVLProcessor's inputs (its own layout and tiles)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(llm.model_dir, extra_special_tokens=MARKS)
    processor = HFProcessor(image_processor=llm.image_prompts.processor(), tokenizer=tokenizer,
                            image_seq_length=SEQ_LEN)
    out = processor(text=text, images=images, return_tensors="pt")
    return {k: out[k] for k in ("input_ids", "pixel_values")}


def hf_generate(hf_model, inputs: dict) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def tokens(llm: LLM, prompts: list) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(prompts, GREEDY)]


def test_layout_rows_and_logits_match_hf(llm, hf_model):
    """Two images in one prompt: the ids are HF's processor's (<img>, 7 then 3 tiles' rows, </img>); the tiles'
    rows within 1e-5 of HF's get_image_features; every position's float32 logits within 1e-5 of the largest."""
    inputs = hf_inputs(llm, images_of(0))
    ids, tiles = llm.image_prompts.prompt(TWO, images_of(0), "test")
    assert ids == inputs["input_ids"][0].tolist() and len(tiles) == 10
    assert all(set(ids[t.offset : t.offset + t.length]) == {llm.image_prompts.cfg.image_token_id} for t in tiles)
    with torch.no_grad():
        expected = hf_model(**inputs).logits[0].numpy()
        hf_rows = hf_model.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output.numpy()
    rows = np.stack(llm.engine.runner.vision.encode(list(tiles)))
    assert np.abs(rows - hf_rows).max() <= 1e-5 * np.abs(hf_rows).max()
    placed, mask = np.zeros((len(ids), rows.shape[-1]), np.float32), np.zeros(len(ids), bool)
    for t, made in zip(tiles, rows):
        placed[t.offset : t.offset + t.length], mask[t.offset : t.offset + t.length] = made, True
    assert np.abs(our_logits(llm, np.asarray(ids), placed, mask) - expected).max() <= 1e-5 * np.abs(expected).max()


def test_engine_greedy_matches_hf(llm, hf_model):
    """Greedy tokens of the two-image prompt through the engine (16-token chunks cut the tiles' runs) are HF
    generate's; its 10 new tiles go through the tower in one call (of 16); HF's expanded ids run as they are."""
    vision = llm.engine.runner.vision
    encoded, calls = vision.images_encoded, vision.tower_calls
    (out,) = tokens(llm, [{"prompt": TWO, "multi_modal_data": {"image": images_of(10)}}])
    assert (vision.images_encoded - encoded, vision.tower_calls - calls) == (10, 1)
    inputs = hf_inputs(llm, images_of(10))
    assert out == hf_generate(hf_model, inputs)
    expanded = {"prompt_token_ids": inputs["input_ids"][0].tolist(), "multi_modal_data": {"image": images_of(10)}}
    assert tokens(llm, [expanded]) == [out]


def test_batch_of_image_and_text_prompts_as_each_alone(llm):
    """Image and text prompts in one batch, chunked prefill cutting their tiles, give each one's tokens alone; the
    prefix cache serves a rerun's image pages, and none past the first tile's start to the same text with other
    images (pages keyed by each tile's pixels)."""
    one = "USER: <IMG_CONTEXT>\nThe quick brown fox ASSISTANT:"
    prompts = [{"prompt": TWO, "multi_modal_data": {"image": images_of(20)}}, "The quick brown fox",
               {"prompt": one, "multi_modal_data": {"image": picture(22, 40, 40)}}]  # one tile, no thumbnail
    together = tokens(llm, prompts)
    llm.reset_prefix_cache()
    assert together == [tokens(llm, [p])[0] for p in prompts]
    again = llm.generate(prompts[0], GREEDY)[0]
    other = llm.generate({"prompt": TWO, "multi_modal_data": {"image": images_of(30)}}, GREEDY)[0]
    first = llm.image_prompts.prompt(TWO, images_of(30), "test")[1][0].offset
    assert again.num_cached_tokens >= 64 and other.num_cached_tokens <= first


def test_tower_variants_match_hf(tmp_path, llm, hf_model):
    """InternViT-6B's RMSNorm and q/k norms without q/k/v biases, with a final LayerNorm (use_mean_pooling false);
    and the module's tower read at vision_feature_layer -2: the tiles' rows within 1e-5 of HF's get_image_features."""
    pixels = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    path = save_tiny_internvl(tmp_path, norm_type="rms_norm", use_qk_norm=True, attention_bias=False,
                              use_mean_pooling=False)
    hf = transformers.InternVLForConditionalGeneration.from_pretrained(path).eval()
    cfg = read_vision_language_config(json.loads((path / "config.json").read_text()))
    earlier = dataclasses.replace(llm.image_prompts.cfg, feature_layer=-2)
    with torch.no_grad():
        expected = [hf.model.get_image_features(pixel_values=torch.tensor(pixels)).pooler_output.numpy(),
                    hf_model.model.get_image_features(pixel_values=torch.tensor(pixels),
                                                      vision_feature_layer=-2).pooler_output.numpy()]
    features = jax.jit(image_features, static_argnames="cfg")  # one program each (op by op is slower, cold)
    rows = [features(load_vision_weights(path, cfg, np.float32), pixels, cfg=cfg),
            features(llm.engine.runner.vision.weights, pixels, cfg=earlier)]
    for ours, theirs in zip(rows, expected):
        assert np.abs(np.asarray(ours) - theirs).max() <= 1e-5 * np.abs(theirs).max()


def test_chat_with_image_url(llm, hf_model):
    """LLM.chat puts <IMG_CONTEXT> and a newline (as InternVL's chat template renders an image part) for a data: URL
    image part; the reply is HF's."""
    image = random_image(4, 56)
    (out,) = llm.chat(chat_message(image), GREEDY)
    assert out.prompt == "USER: <IMG_CONTEXT>\nThe quick brown fox ASSISTANT:"
    assert out.outputs[0].token_ids == hf_generate(hf_model, hf_inputs(llm, [Image.fromarray(image)], out.prompt))


def test_videos_and_bad_configs_refused(llm, model_dir):
    """A video (as multi_modal_data or a <video> mark) and configs this model cannot run are refused by name."""
    with pytest.raises(ValueError, match=r"served modalities are \('image',\), got \['video'\]"):
        llm.generate({"prompt": TWO, "multi_modal_data": {"video": [picture(0)]}}, GREEDY)
    with pytest.raises(ValueError, match="'<video>'; videos are not supported"):
        llm.generate({"prompt": "<video>" + TWO, "multi_modal_data": {"image": images_of(0)}}, GREEDY)
    with pytest.raises(ValueError, match=r"marks 1 image\(s\) with '<IMG_CONTEXT>' and 2 were given"):
        llm.generate({"prompt": "<IMG_CONTEXT>", "multi_modal_data": {"image": images_of(0)}}, GREEDY)
    hf = json.loads((model_dir / "config.json").read_text())
    for field, value, accepted in [("downsample_ratio", 0.3, "1 / n"), ("vision_feature_select_strategy", "full",
                                   "'default'"), ("image_seq_length", 16, "rows a tile")]:
        with pytest.raises(ConfigError, match=f"{field}.*{accepted}"):
            read_vision_language_config({**hf, field: value})


def test_registry_runs_the_text_config(model_dir):
    """InternVLForConditionalGeneration runs its text_config's Qwen2 (InternVL3), Qwen3 (InternVL3.5) or Llama."""
    hf = json.loads((model_dir / "config.json").read_text())
    assert "InternVLForConditionalGeneration" in SUPPORTED_ARCHITECTURES
    assert from_hf_config(hf) == from_hf_config({**hf["text_config"], "architectures": ["Qwen2ForCausalLM"]})
    for kind, arch in [("qwen3", "Qwen3ForCausalLM"), ("llama", "LlamaForCausalLM")]:
        text = {**COMMON, "model_type": kind, "head_dim": 16}
        assert from_hf_config({**hf, "text_config": text}) == from_hf_config({**text, "architectures": [arch]})


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_tower_program_lowers_for_the_accelerators(llm, platform):
    """The tower's batched program over tiles (InternViT, shuffle, projector) lowers for CUDA and TPU."""
    from accelerator_programs import EXPORT_PLATFORMS
    from jax import export

    tower = llm.engine.runner.vision.batch_program(np.zeros((2, 3, 32, 32), np.float32))
    export.export(tower.function, platforms=(EXPORT_PLATFORMS[platform],))(*tower.args, **tower.kwargs)
