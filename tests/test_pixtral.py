"""Mistral 3 (Mistral3ForConditionalGeneration: the Pixtral tower, its patch-merging projector, a Mistral language
model) against HF transformers on the same tiny weights: the tower's rows (and the [IMG_BREAK] / [IMG_END] rows of
each image's run), every position's float32 logits of an image prompt, greedy tokens and logprobs through the
engine with chunks cutting the image, two images of different sizes, LLM.chat, the ragged step lowering for CUDA
and TPU."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
import torch
import transformers
from hf_models import COMMON, save_tiny_tokenizer
from PIL import Image
from test_llava import chat_message
from vision_models import random_image

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.paged import init_paged_cache
from jaxinfer.cache.ragged_view import RaggedPagedCache
from jaxinfer.models import forward_with_taps, lm_logits
from jaxinfer.models.embed_override import EmbedOverride
from jaxinfer.models.registry import SUPPORTED_ARCHITECTURES, from_hf_config

IMG, IMG_BREAK, IMG_END = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
CHAT_TEMPLATE = (  # an image part renders as one [IMG], as Mistral's template writes it
    "{% for m in messages %}{{ m['role'] | upper }}: {% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}[IMG]{% else %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %} {% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
# 8x8 patches merged 2x2 (one [IMG] per 16x16 pixels), images resized to at most 64 pixels a side
TOWER = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
             image_size=64, hidden_act="silu")
PROMPT = "USER: [IMG]The quick brown fox ASSISTANT:"
GREEDY = SamplingParams(max_tokens=8, temperature=0)
WITH_LOGPROBS = SamplingParams(max_tokens=8, temperature=0, logprobs=0)
# 16 tokens a step: an 80x48 image's run (3 merged rows of 4 blocks and a break: 15 tokens from position 6) is cut
# across two chunks; XLA's attention (not the native CPU kernels): what accelerators compile
KNOBS = dict(dtype="float32", max_seq_len=128, max_num_batched_tokens=16, page_size=4, num_pages=60, max_num_seqs=1,
             limit_mm_per_prompt={"image": 2}, cpu_kernels=False)


def save_tiny_mistral3(path: Path) -> Path:
    """A random float32 Mistral 3 (2-layer Pixtral tower, 2-layer Mistral) with a tokenizer holding the image tokens
    and a Pixtral image processor, saved as transformers 5.24 saves them."""
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMG, IMG_BREAK, IMG_END]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    text = {**COMMON, "vocab_size": 320, "model_type": "mistral", "tie_word_embeddings": False}
    config = transformers.Mistral3Config(text_config=text, vision_config=TOWER, spatial_merge_size=2,
                                         image_token_index=tokenizer.convert_tokens_to_ids(IMG),
                                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.Mistral3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # a tower loud enough that images move the logits; norms off their init
        for name, param in model.named_parameters():
            if "vision_tower" in name or "projector" in name:
                param.mul_(4.0) if param.dim() > 1 else param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    transformers.PixtralImageProcessorPil(patch_size={"height": 8, "width": 8},
                                          size={"longest_edge": 64}).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_mistral3(tmp_path_factory.mktemp("mistral3"))


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.Mistral3ForConditionalGeneration.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, **KNOBS)


def picture(seed: int, width: int = 80, height: int = 48) -> Image.Image:
    """A random image; 80 x 48 is resized to 64 x 48 (within 64 pixels, multiples of 16): 3 x 4 merged blocks."""
    return Image.fromarray(random_image(seed, 56)).resize((width, height))


def hf_inputs(llm: LLM, images: list[Image.Image], text: str = PROMPT) -> dict:
    """HF's inputs for the prompt as our processor expands it: ids, the same pixels (padded to the largest, as
    HF's processor batches them) and each image's size."""
    ids, carried = llm.image_prompts.prompt(text, images, "test")
    sizes = [i.pixels.shape[1:] for i in carried]
    height, width = max(s[0] for s in sizes), max(s[1] for s in sizes)
    pixels = np.stack([np.pad(i.pixels, ((0, 0), (0, height - h), (0, width - w)))
                       for i, (h, w) in zip(carried, sizes)])
    return dict(input_ids=torch.tensor([ids]), pixel_values=torch.tensor(pixels), image_sizes=torch.tensor(sizes))


def hf_generate(hf_model, inputs: dict) -> tuple[list[int], np.ndarray]:
    """HF's greedy tokens and each one's logprob."""
    with torch.no_grad():
        out = hf_model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False, output_scores=True,
                                return_dict_in_generate=True)
    tokens = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    return tokens, np.asarray([torch.log_softmax(s[0], -1)[t].item() for s, t in zip(out.scores, tokens)])


def greedy_logprobs(llm: LLM, images: list[Image.Image], text: str = PROMPT) -> tuple[list[int], np.ndarray]:
    out = llm.generate({"prompt": text, "multi_modal_data": {"image": images}}, WITH_LOGPROBS)[0].outputs[0]
    return out.token_ids, np.asarray([step[t].logprob for step, t in zip(out.logprobs, out.token_ids)])


def our_logits(llm: LLM, ids: np.ndarray, placed: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Every position's float32 logits of one sequence through the model, rows placed where mask is set."""
    positions = np.arange(len(ids), dtype=np.int32)
    view = RaggedPagedCache(init_paged_cache(llm.config, 1, 128, np.float32, page_size=4), np.zeros(len(ids), np.int32))
    hidden, _, _ = forward_with_taps(llm.weights, ids[None], positions[None], view, llm.config, (),
                                     EmbedOverride(placed, mask))
    return np.asarray(lm_logits(llm.weights, hidden))[0]


def test_tower_rows_and_logits_match_hf(llm, hf_model):
    """The run's layout (HF's PixtralProcessor's), the tower's rows at its [IMG]s within 1e-5 of HF's
    get_image_features, the break and end rows their tokens' embeddings, and every position's float32 logits of a
    prompt with text after the image within 1e-5 of the largest."""
    inputs = hf_inputs(llm, [picture(0)])
    ids = inputs["input_ids"][0].numpy()
    (image,) = llm.image_prompts.prompt(PROMPT, [picture(0)], "test")[1]
    cfg = llm.image_prompts.cfg
    run = ids[image.offset : image.offset + image.length].reshape(3, 5)
    assert (image.offset, image.length, image.pixels.shape) == (6, 15, (3, 48, 64))
    assert (run[:, :4] == cfg.image_token_id).all() and run[:2, 4].tolist() == [cfg.image_break_token_id] * 2
    assert run[2, 4] == cfg.image_end_token_id
    with torch.no_grad():
        expected = hf_model(**inputs).logits[0].numpy()
        hf_rows = hf_model.model.get_image_features(pixel_values=inputs["pixel_values"],
                                                    image_sizes=inputs["image_sizes"]).pooler_output[0].numpy()
        table = hf_model.get_input_embeddings().weight.numpy()
    rows = llm.engine.runner.vision.features(image).reshape(3, 5, -1)
    assert np.abs(rows[:, :4].reshape(12, -1) - hf_rows).max() <= 1e-5 * np.abs(hf_rows).max()
    assert np.array_equal(rows[:2, 4], table[[cfg.image_break_token_id] * 2])
    assert np.array_equal(rows[2, 4], table[cfg.image_end_token_id])
    placed, mask = np.zeros((len(ids), rows.shape[-1]), np.float32), np.zeros(len(ids), bool)
    placed[image.offset : image.offset + image.length], mask[image.offset : image.offset + image.length] = \
        rows.reshape(15, -1), True
    assert np.abs(our_logits(llm, ids, placed, mask) - expected).max() <= 1e-5 * np.abs(expected).max()


def test_a_padded_image_shares_its_bucket_program_and_keeps_hf_rows(llm, hf_model):
    """A 3 x 3-block image padded to 12 blocks (models/tower_patches) takes the tower program of 4 x 3 and 3 x 4
    images (the same input shapes); its [IMG] rows are HF's within 1e-5, its run's breaks and end in place."""
    vision, cfg = llm.engine.runner.vision, llm.image_prompts.cfg
    images = [picture(4, 48, 48), picture(5, 64, 48), picture(6, 48, 64)]
    shapes = [jax.tree.map(np.shape, vision.program(i.pixels).args[1]) for i in
              (llm.image_prompts.prompt(PROMPT, [image], "test")[1][0] for image in images)]
    assert shapes[0] == shapes[1] == shapes[2]
    (image,) = llm.image_prompts.prompt(PROMPT, images[:1], "test")[1]
    inputs = hf_inputs(llm, images[:1])
    with torch.no_grad():
        hf_rows = hf_model.model.get_image_features(pixel_values=inputs["pixel_values"],
                                                    image_sizes=inputs["image_sizes"]).pooler_output[0].numpy()
    rows = vision.features(image).reshape(3, 4, -1)
    assert np.abs(rows[:, :3].reshape(9, -1) - hf_rows).max() <= 1e-5 * np.abs(hf_rows).max()
    table = hf_model.get_input_embeddings().weight.detach().numpy()
    assert np.array_equal(rows[:, 3], table[[cfg.image_break_token_id] * 2 + [cfg.image_end_token_id]])


def test_engine_greedy_matches_hf(hf_model, llm):
    """Greedy tokens and logprobs through the engine as HF's generate (16-token chunks cut the image's run);
    another image gives other tokens; a rerun hits the prefix cache, the image's pages too."""
    (out_a, logprobs_a), (out_b, _) = greedy_logprobs(llm, [picture(0)]), greedy_logprobs(llm, [picture(1)])
    hits = llm.engine.scheduler.prefix_hits
    again = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": picture(0)}}, GREEDY)
    hf_a, hf_logprobs_a = hf_generate(hf_model, hf_inputs(llm, [picture(0)]))
    assert out_a == hf_a
    assert np.abs(logprobs_a - hf_logprobs_a).max() <= 1e-4
    assert out_a != out_b and again[0].outputs[0].token_ids == out_a
    assert llm.engine.scheduler.prefix_hits > hits


def test_two_images_of_different_sizes(llm, hf_model):
    """Two images whose runs differ (3 x 4 merged blocks: 15 tokens; 2 x 1: 4), text between and after them; the
    ids HF's processor would give (runs already expanded) run as they are."""
    two = "USER: [IMG] and [IMG] fox:"
    images = [picture(2), picture(3, 16, 32)]
    ids, carried = llm.image_prompts.prompt(two, images, "test")
    assert [i.length for i in carried] == [15, 4]
    again, found = llm.image_prompts.prompt(ids, images, "test")
    assert again == ids and [(i.offset, i.length, i.content_hash) for i in found] == \
        [(i.offset, i.length, i.content_hash) for i in carried]
    hf, hf_logprobs = hf_generate(hf_model, hf_inputs(llm, images, two))
    out, logprobs = greedy_logprobs(llm, images, two)
    assert out == hf and np.abs(logprobs - hf_logprobs).max() <= 1e-4


def test_chat_with_image_url(llm, hf_model):
    """LLM.chat puts one [IMG] for a data: URL image part; the reply is HF's."""
    image = random_image(4, 56)
    (out,) = llm.chat(chat_message(image), GREEDY)
    assert out.prompt == "USER: [IMG]The quick brown fox ASSISTANT:"
    inputs = hf_inputs(llm, [Image.fromarray(image)], out.prompt)
    assert out.outputs[0].token_ids == hf_generate(hf_model, inputs)[0]


def test_registry_reads_the_language_model(model_dir):
    """The registry no longer refuses the architecture: its ModelConfig is the text_config's Mistral."""
    import json

    hf = json.loads((model_dir / "config.json").read_text())
    assert "Mistral3ForConditionalGeneration" in SUPPORTED_ARCHITECTURES
    assert from_hf_config(hf) == from_hf_config({**hf["text_config"], "architectures": ["MistralForCausalLM"]})


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_ragged_step_lowers_for_the_accelerators(llm, platform):
    """The widest ragged step, its embedding override among the inputs, lowers for CUDA and TPU."""
    from accelerator_programs import EXPORT_PLATFORMS, step_programs
    from jax import export

    runner = llm.engine.runner
    try:
        program, args, kwargs = [(p, a, k) for shape, p, a, k in step_programs(llm, platform)
                                 if shape[0] == "ragged"][-1]
        export.export(program, platforms=(EXPORT_PLATFORMS[platform],))(*args, **kwargs)
    finally:
        runner.branchless, runner.stop_early = False, True
