"""LLaVA against HF transformers on the same tiny weights and pixels, through the model, the engine (chunked
prefill cutting the image's placeholders, prefix caching on and off), LLM.chat and the server; bad inputs
refused by name."""

from __future__ import annotations

import base64
import copy
import io
import json

import numpy as np
import openai
import pytest
import torch
import transformers
from PIL import Image
from vision_models import random_image, save_tiny_llava

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.contiguous import init_cache
from jaxinfer.checkpoint.loader import load_vision_weights
from jaxinfer.config.beam_search import BeamSearchParams
from jaxinfer.config.model import ConfigError
from jaxinfer.engine.beams import beam_score
from jaxinfer.entrypoints.multimodal import ImagePrompts
from jaxinfer.models import forward_with_taps, lm_logits
from jaxinfer.models.embed_override import EmbedOverride
from jaxinfer.models.llava import image_features, read_llava_config
from jaxinfer.runtime import step_programs
from jaxinfer.runtime.prompt_logprobs import prompt_buckets

PROMPT = "USER: <image>\nThe quick brown fox ASSISTANT:"
GREEDY = SamplingParams(max_tokens=6, temperature=0)
# 16 tokens a step: the prompt's 16 image placeholders (from position 8) are cut across two chunks
# XLA's attention (not the native CPU kernels): what accelerators compile, and what the lowering test exports.
# 19 pages of 8 tokens: two image prompts decoding together run out of pages (see the preemption test)
KNOBS = dict(dtype="float32", max_seq_len=96, max_num_batched_tokens=16, page_size=8, num_pages=20, max_num_seqs=2,
             limit_mm_per_prompt={"image": 2}, cpu_kernels=False)


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    return save_tiny_llava(tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def hf_llava(llava_dir):
    return transformers.LlavaForConditionalGeneration.from_pretrained(llava_dir).eval()


@pytest.fixture(scope="module")
def llm(llava_dir):
    return LLM(llava_dir, **KNOBS)


def hf_greedy(hf_llava, llm: LLM, image: np.ndarray, text: str = PROMPT) -> list[int]:
    """HF's greedy tokens for the prompt as our processor expands it, on the same pixels."""
    ids, images = llm.image_prompts.prompt(text, [Image.fromarray(image)], "test")
    with torch.no_grad():
        out = hf_llava.generate(input_ids=torch.tensor([ids]), pixel_values=torch.tensor(images[0].pixels[None]),
                                max_new_tokens=GREEDY.max_tokens, do_sample=False)
    return out[0, len(ids):].tolist()


def image_prompt(image: np.ndarray, text: str = PROMPT) -> dict:
    return {"prompt": text, "multi_modal_data": {"image": image}}


def test_logits_match_hf(llava_dir, hf_llava, llm):
    """Every position's float32 logits of a prompt with an image, image rows placed by the override."""
    cfg = read_llava_config(json.loads((llava_dir / "config.json").read_text()))
    ids, images = llm.image_prompts.prompt(PROMPT, [Image.fromarray(random_image(0))], "test")
    pixels = images[0].pixels[None]
    with torch.no_grad():
        expected = hf_llava(input_ids=torch.tensor([ids]), pixel_values=torch.tensor(pixels)).logits[0].numpy()
        hf_rows = hf_llava.model.get_image_features(pixel_values=torch.tensor(pixels))
    rows = np.asarray(image_features(load_vision_weights(llava_dir, cfg, np.float32), pixels, cfg))[0]
    hf_rows = getattr(hf_rows, "pooler_output", hf_rows)
    hf_rows = np.asarray(hf_rows[0])
    assert np.abs(rows - hf_rows).max() <= 1e-5 * np.abs(hf_rows).max()  # float32 rounding only
    placed = np.zeros((len(ids), cfg.text_hidden_size), np.float32)
    placed[images[0].offset : images[0].offset + images[0].length] = rows
    mask = np.asarray(ids) == cfg.image_token_id
    cache = init_cache(llm.config, 1, 96, np.float32)
    positions = np.arange(len(ids), dtype=np.int32)[None]
    hidden, _, _ = forward_with_taps(llm.weights, np.asarray([ids]), positions, cache, llm.config, (),
                                     EmbedOverride(placed, mask))
    got = np.asarray(lm_logits(llm.weights, hidden))[0]
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize("tower", ["clip", "siglip"])
def test_feature_layers_and_strategies_match_hf(tmp_path, tower):
    """CLIP: a list of feature layers (concatenated) and the "full" strategy (class token kept), 17 rows an
    image; SigLIP: its last layer, the default strategy dropping its first patch as HF does, 15 rows."""
    if tower == "clip":
        path = save_tiny_llava(tmp_path, vision_feature_layer=[-3, -1], vision_feature_select_strategy="full")
    else:
        path = save_tiny_llava(tmp_path, siglip=True, vision_feature_layer=-1)
    config = json.loads((path / "config.json").read_text())
    config["image_seq_length"] = rows = 17 if tower == "clip" else 15
    cfg = read_llava_config(config)
    model = transformers.LlavaForConditionalGeneration.from_pretrained(path).eval()
    pixels = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        expected = model.model.get_image_features(pixel_values=torch.tensor(pixels))
    expected = np.stack([np.asarray(e) for e in getattr(expected, "pooler_output", expected)])
    got = np.asarray(image_features(load_vision_weights(path, cfg, np.float32), pixels, cfg))
    assert got.shape == expected.shape == (2, rows, 64)
    # float32 rounding: SigLIP's unnormed embeddings reach the hundreds here (1.4e-5 of the largest seen)
    assert np.abs(got - expected).max() <= 3e-5 * np.abs(expected).max()


@pytest.mark.parametrize("caching", [True, False], ids=["prefix-cache", "no-prefix-cache"])
def test_engine_greedy_matches_hf(llava_dir, hf_llava, llm, caching):
    """Greedy tokens through the engine as HF's, with the image cut by chunked prefill; the same text with
    another image gives other tokens and shares no page of the image (a second run is a prefix hit)."""
    llm = llm if caching else LLM(llava_dir, enable_prefix_caching=False, **KNOBS)
    a, b = random_image(0), random_image(1)
    scheduler = llm.engine.scheduler
    out_a = llm.generate(image_prompt(a), GREEDY)[0].outputs[0].token_ids
    hits = scheduler.prefix_hits
    out_b = llm.generate(image_prompt(b), GREEDY)[0].outputs[0].token_ids
    hits_b = scheduler.prefix_hits - hits
    again = llm.generate(image_prompt(a), GREEDY)[0].outputs[0].token_ids
    hits_again = scheduler.prefix_hits - hits - hits_b
    assert out_a == hf_greedy(hf_llava, llm, a) and out_b == hf_greedy(hf_llava, llm, b)
    assert out_a != out_b and again == out_a
    if llm.engine.blocks.prefix_caching:
        ids, (image,) = llm.image_prompts.prompt(PROMPT, [Image.fromarray(a)], "test")
        page = llm.engine.config.page_size
        assert image.offset == 6 and hits_b == 0  # its first page holds placeholders: b shares no page with a
        assert hits_again == (len(ids) - 1) // page * page  # a's text and image pages, all but the last token
    assert llm.engine.runner.vision.images_encoded == 2  # once per image: chunks and the rerun read the kept rows


def test_beam_search_with_an_image_matches_hf(llm, hf_llava):
    """LLM.beam_search of an image prompt: HF's num_beams beams and scores on the same pixels (every step
    runs the image with its beam: pages shared by content hash, the tower run once)."""
    image, params = random_image(9), BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True)
    encoded = llm.engine.runner.vision.images_encoded
    (out,) = llm.beam_search([image_prompt(image)], params)
    ids, images = llm.image_prompts.prompt(PROMPT, [Image.fromarray(image)], "test")
    config = copy.deepcopy(hf_llava.generation_config)
    config.eos_token_id = None  # every beam runs to max_new_tokens, as ignore_eos
    with torch.no_grad():
        hf = hf_llava.generate(input_ids=torch.tensor([ids]), pixel_values=torch.tensor(images[0].pixels[None]),
                               generation_config=config, num_beams=2, num_return_sequences=2, do_sample=False,
                               max_new_tokens=4, return_dict_in_generate=True, output_scores=True, pad_token_id=0)
    assert [seq.tokens[len(ids):] for seq in out.sequences] == [s[len(ids):].tolist() for s in hf.sequences]
    np.testing.assert_allclose([beam_score(seq.cum_logprob, 4, 1.0) for seq in out.sequences],
                               hf.sequences_scores.numpy(), atol=1e-4)
    assert llm.engine.runner.vision.images_encoded == encoded + 1


def test_prompt_logprobs_with_an_image_match_hf(llm, hf_llava):
    """prompt_logprobs of an image prompt: HF's log-softmax at every position, the image rows in the pass."""
    image = random_image(10)
    (out,) = llm.generate(image_prompt(image), SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2))
    ids, images = llm.image_prompts.prompt(PROMPT, [Image.fromarray(image)], "test")
    with torch.no_grad():
        logits = hf_llava(input_ids=torch.tensor([ids]), pixel_values=torch.tensor(images[0].pixels[None])).logits
    expected = torch.log_softmax(logits[0, :-1].double(), -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert out.prompt_token_ids == ids and out.prompt_logprobs[0] is None
    got = [step[token].logprob for step, token in zip(out.prompt_logprobs[1:], ids[1:])]
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-4)


def test_two_images_and_text_prompts_in_one_batch(llm, hf_llava):
    """Prompts with and without images in one call; two images in one prompt take their own placeholders."""
    a, b = random_image(2), random_image(3)
    two = "USER: <image><image>\nThe quick ASSISTANT:"
    outs = llm.generate([image_prompt(a), "The quick brown fox", image_prompt([a, b], two)], GREEDY)
    assert outs[0].outputs[0].token_ids == hf_greedy(hf_llava, llm, a)
    ids, images = llm.image_prompts.prompt(two, [Image.fromarray(a), Image.fromarray(b)], "test")
    assert [(i.offset, i.length) for i in images] == [(6, 16), (22, 16)]  # back to back
    with torch.no_grad():
        hf = hf_llava.generate(input_ids=torch.tensor([ids]), max_new_tokens=GREEDY.max_tokens, do_sample=False,
                               pixel_values=torch.tensor(np.stack([i.pixels for i in images])))
    assert outs[2].outputs[0].token_ids == hf[0, len(ids):].tolist()
    expanded = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": [a, b]}}, GREEDY)
    assert expanded[0].outputs[0].token_ids == outs[2].outputs[0].token_ids  # placeholders expanded already


def test_preempted_image_requests_recompute_the_same_tokens(llm):
    """Two image prompts that outgrow the pool together: one is preempted and recomputed from its kept image
    rows (the tower does not run again), and both give the tokens they give alone."""
    images = [random_image(7), random_image(8)]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    alone = [llm.generate(image_prompt(image), params)[0].outputs[0].token_ids for image in images]
    preempted, encoded = llm.engine.scheduler.num_preemptions, llm.engine.runner.vision.images_encoded
    llm.reset_prefix_cache()
    together = llm.generate([image_prompt(image) for image in images], params)
    assert llm.engine.scheduler.num_preemptions > preempted
    assert [out.outputs[0].token_ids for out in together] == alone
    assert llm.engine.runner.vision.images_encoded == encoded  # rows kept (by the request, and by content hash)


def test_program_set_counts_the_tower(llm):
    """A vision-language model's programs: the text model's, plus its tower's (compiled by warm-up)."""
    runner = llm.engine.runner
    text_programs = len(llm.engine.step_hosts()) + 1 + len(prompt_buckets(llm.engine.config.max_seq_len))
    assert llm.engine.program_count() == text_programs + 1
    assert runner.programs(llm.engine.step_hosts())[-1]().function is step_programs.image_features


def data_url(image: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat_message(image: np.ndarray) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}},
                                         {"type": "text", "text": "The quick brown fox"}]}]


def test_chat_with_image_url(llm, hf_llava):
    """LLM.chat reads a data: URL image part; the reply is HF's greedy reply to the rendered prompt."""
    image = random_image(4)
    (out,) = llm.chat(chat_message(image), GREEDY)
    assert out.prompt == "USER: <image>\nThe quick brown foxASSISTANT:"  # the template's own image part
    assert out.outputs[0].token_ids == hf_greedy(hf_llava, llm, image, out.prompt)


def test_bad_inputs_refused_by_name(llm, tmp_path):
    image = random_image(5)
    with pytest.raises(ValueError, match=r"limit_mm_per_prompt.*'image': 2"):
        llm.generate(image_prompt([image] * 3, "<image>" * 3), GREEDY)
    with pytest.raises(ValueError, match=r"marks 1 image\(s\) with '<image>' and 2 were given"):
        llm.generate(image_prompt([image, image]), GREEDY)
    with pytest.raises(ValueError, match="served modalities"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"video": image}}, GREEDY)
    with pytest.raises(TypeError, match=r"multi_modal_data.image\[0\] must be a PIL image"):
        llm.generate(image_prompt("not an image"), GREEDY)
    local = tmp_path / "x.png"
    Image.fromarray(image).save(local)
    message = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"file://{local}"}}]}]
    with pytest.raises(ValueError, match=r"messages\[0\].content\[0\].image_url.url: file:// URLs are refused"):
        llm.chat(message, GREEDY)
    with pytest.raises(ConfigError, match="limit_mm_per_prompt"):
        LLM(llm.model_dir, limit_mm_per_prompt={"audio": 1})


def test_server_chat_with_data_url(llm, hf_llava):
    """The official openai client sends an image_url part; a text-only model refuses one with a 400 naming it."""
    from live_server import serve_in_thread

    from jaxinfer.entrypoints.openai import ServerConfig

    image = random_image(6)
    with serve_in_thread(llm, ServerConfig("llava")) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(model="llava", messages=chat_message(image), max_tokens=6,
                                               temperature=0)
        beams = client.chat.completions.create(model="llava", messages=chat_message(image), max_tokens=3, n=2,
                                               extra_body={"use_beam_search": True})
        response = client.responses.create(model="llava", max_output_tokens=6, temperature=0, input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": data_url(image)},
                                         {"type": "input_text", "text": "The quick brown fox"}]}])
    (expected,) = llm.chat(chat_message(image), GREEDY)
    assert reply.choices[0].message.content == expected.outputs[0].text == response.output_text
    (searched,) = llm.beam_search([image_prompt(image, expected.prompt)], BeamSearchParams(beam_width=2, max_tokens=3))
    assert [c.message.content for c in beams.choices] == [seq.text for seq in searched.sequences]


def test_text_only_model_refuses_images(served_text_model):
    llm, client = served_text_model
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\].content\[0\]"):
        client.chat.completions.create(model="tiny", messages=chat_message(random_image(0)), max_tokens=2)
    with pytest.raises(ValueError, match=r"this model takes no images \(it has no vision tower\)"):
        llm.generate(image_prompt(random_image(0)), GREEDY)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_step_and_tower_programs_lower_for_the_accelerators(llm, platform):
    """The ragged steps with their image rows, and the tower, lower for CUDA and TPU (no accelerator here)."""
    from accelerator_programs import EXPORT_PLATFORMS, step_programs
    from jax import export

    runner = llm.engine.runner
    try:
        ragged = [(program, args, kwargs) for shape, program, args, kwargs in step_programs(llm, platform)
                  if shape[0] == "ragged"]
        assert all("images" in kwargs for _, _, kwargs in ragged)
        tower = runner.vision.program()
        for program, args, kwargs in ragged[-1:] + [(tower.function, tower.args, tower.kwargs)]:  # the widest step
            export.export(program, platforms=(EXPORT_PLATFORMS[platform],))(*args, **kwargs)
    finally:
        runner.branchless, runner.stop_early = False, True


def test_a_model_type_the_installed_transformers_lacks_is_refused_by_name():
    """A vision-language config's defaults come from transformers' config class: a model_type it lacks (an older
    transformers than the checkpoint's) is a ConfigError naming it and the version, not transformers' list."""
    version = transformers.__version__
    with pytest.raises(ConfigError, match=rf"model_type 'llava_from_2030' is unknown to .*\({version}\)"):
        read_llava_config({"model_type": "llava_from_2030", "architectures": ["LlavaForConditionalGeneration"]})


def test_an_image_processor_the_installed_transformers_lacks_is_refused_by_name(tmp_path):
    """preprocessor_config.json naming a processor class this transformers lacks (an older one than the
    checkpoint's): a ValueError naming the file and the version, on the first image."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "FutureImageProcessor"}))
    with pytest.raises(ValueError, match=rf"preprocessor_config.json\) that the installed transformers "
                                         rf"\({transformers.__version__}\) loads"):
        ImagePrompts(tmp_path, None, None, 1).processor()
