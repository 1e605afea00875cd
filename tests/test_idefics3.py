"""Idefics3 / SmolVLM (a SigLIP tower, the pixel-shuffle connector, a Llama) against HF transformers on the same tiny
weights: the prompt layout against HF's Idefics3Processor, the tiles' rows against get_image_features, every
position's float32 logits of an image prompt, greedy tokens and logprobs through the engine (image splitting on
and off, chunks cutting tiles), LLM.chat, the registry, the ragged step lowering for CUDA and TPU."""

from __future__ import annotations

from pathlib import Path

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
from jaxinfer.models.registry import SUPPORTED_ARCHITECTURES, from_hf_config
from jaxinfer.models.vision_language import read_vision_language_config

MARKS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + \
    [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
CHAT_TEMPLATE = (  # an image part renders as one <image>, as SmolVLM's template writes it
    "{% for m in messages %}{{ m['role'] | upper }}: {% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>{% else %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %} {% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
# 32-pixel tiles of 4x4 patches, shuffled 2x2: 4 <image> rows a tile; images resized to 64 pixels on the long side
TOWER = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
             image_size=32)
SEQ_LEN = 4
PROMPT = "USER: <image>The quick brown fox ASSISTANT:"
GREEDY = SamplingParams(max_tokens=8, temperature=0)
WITH_LOGPROBS = SamplingParams(max_tokens=8, temperature=0, logprobs=0)
# 16 tokens a step: a split image's layout (4 tiles and the global one, 46 tokens) is cut across chunks mid-tile
KNOBS = dict(dtype="float32", max_seq_len=128, max_num_batched_tokens=16, page_size=4, num_pages=40, max_num_seqs=1,
             cpu_kernels=False)


def save_tiny_idefics3(path: Path) -> Path:
    """A random float32 Idefics3 (2-layer SigLIP tower, 2-layer Llama) with a tokenizer holding its marks and an
    image processor, saved as transformers 5.24 saves them."""
    try:
        processor = transformers.Idefics3ImageProcessorPil(size={"longest_edge": 64},
                                                           max_image_size={"longest_edge": 32})
    except ImportError:  # 5.17's lazy import guesses torchvision from the text of the PIL processor's module
        pytest.skip(f"transformers {transformers.__version__} wants torchvision (absent) for Idefics3's image "
                    "processors, the PIL one too")
    save_tiny_tokenizer(path, vocab_size=240)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": MARKS})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    text = {**COMMON, "vocab_size": 320, "model_type": "llama", "tie_word_embeddings": False}
    config = transformers.Idefics3Config(text_config=text, vision_config=TOWER, scale_factor=2,
                                         image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.Idefics3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # a tower loud enough that images move the logits; norms and biases off their init
        for name, param in model.named_parameters():
            if "vision_model" in name or "connector" in name:
                param.mul_(4.0) if param.dim() > 1 else param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_idefics3(tmp_path_factory.mktemp("idefics3"))


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.Idefics3ForConditionalGeneration.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, **KNOBS)


@pytest.fixture
def unsplit(llm):
    """The model's image processor with do_image_splitting false (each image one resized tile) while a test runs."""
    prompts = llm.image_prompts
    kept = prompts.processor()
    prompts._processor = transformers.Idefics3ImageProcessorPil.from_pretrained(prompts.model_dir,
                                                                                do_image_splitting=False)
    yield
    prompts._processor = kept


def picture(seed: int, width: int = 80, height: int = 48) -> Image.Image:
    """A random image; 80 x 48 is resized to 64 x 38, then to 64 x 64 for splitting: 2 x 2 tiles and the global."""
    return Image.fromarray(random_image(seed, 56)).resize((width, height))


def hf_inputs(llm: LLM, image: Image.Image, text: str = PROMPT) -> dict:
    """HF's Idefics3Processor's inputs (its own layout and pixels) for a prompt with one image."""
    processor = transformers.Idefics3Processor(llm.image_prompts.processor(), llm.tokenizer, image_seq_len=SEQ_LEN)
    out = processor(text=text, images=[image], return_tensors="pt")
    return {k: out[k] for k in ("input_ids", "pixel_values", "pixel_attention_mask")}


def hf_generate(hf_model, inputs: dict) -> tuple[list[int], np.ndarray]:
    """HF's greedy tokens and each one's logprob."""
    with torch.no_grad():
        out = hf_model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False, output_scores=True,
                                return_dict_in_generate=True)
    tokens = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    return tokens, np.asarray([torch.log_softmax(s[0], -1)[t].item() for s, t in zip(out.scores, tokens)])


def greedy_logprobs(llm: LLM, image: Image.Image, text: str = PROMPT) -> tuple[list[int], np.ndarray]:
    out = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, WITH_LOGPROBS)[0].outputs[0]
    return out.token_ids, np.asarray([step[t].logprob for step, t in zip(out.logprobs, out.token_ids)])


def test_layout_rows_and_logits_match_hf(llm, hf_model):
    """The prompt's ids are HF's processor's (2 x 2 tiles and the global image: 5 runs of 4 <image>); the tiles'
    rows within 1e-5 of HF's get_image_features; every position's float32 logits within 1e-5 of the largest."""
    inputs = hf_inputs(llm, picture(0))
    ids, tiles = llm.image_prompts.prompt(PROMPT, [picture(0)], "test")
    assert ids == inputs["input_ids"][0].tolist()
    assert [t.length for t in tiles] == [SEQ_LEN] * 5 and all(
        set(ids[t.offset : t.offset + t.length]) == {llm.image_prompts.cfg.image_token_id} for t in tiles)
    with torch.no_grad():
        expected = hf_model(**inputs).logits[0].numpy()
        hf_rows = hf_model.get_image_features(pixel_values=inputs["pixel_values"],
                                              pixel_attention_mask=inputs["pixel_attention_mask"]).pooler_output[0]
    rows = np.concatenate([llm.engine.runner.vision.features(t) for t in tiles])
    assert np.abs(rows - hf_rows.numpy()).max() <= 1e-5 * np.abs(hf_rows.numpy()).max()
    placed, mask = np.zeros((len(ids), rows.shape[-1]), np.float32), np.zeros(len(ids), bool)
    for k, t in enumerate(tiles):
        placed[t.offset : t.offset + t.length], mask[t.offset : t.offset + t.length] = rows[4 * k : 4 * k + 4], True
    assert np.abs(our_logits(llm, np.asarray(ids), placed, mask) - expected).max() <= 1e-5 * np.abs(expected).max()


def test_engine_greedy_matches_hf(hf_model, llm):
    """Greedy tokens and logprobs through the engine as HF's generate (16-token chunks cut the tiles' runs); the
    image's 5 new tiles go through the tower in one call (of 8); HF's already-expanded ids run as they are."""
    vision = llm.engine.runner.vision
    encoded, calls = vision.images_encoded, vision.tower_calls
    out, logprobs = greedy_logprobs(llm, picture(1))
    assert (vision.images_encoded - encoded, vision.tower_calls - calls) == (5, 1)
    inputs = hf_inputs(llm, picture(1))
    hf, hf_logprobs = hf_generate(hf_model, inputs)
    assert out == hf and np.abs(logprobs - hf_logprobs).max() <= 1e-4
    expanded = {"prompt_token_ids": inputs["input_ids"][0].tolist(), "multi_modal_data": {"image": picture(1)}}
    assert llm.generate(expanded, GREEDY)[0].outputs[0].token_ids == out


def test_unsplit_image_matches_hf(hf_model, llm, unsplit):
    """With do_image_splitting false the image is one global tile (one run between its marks); tokens as HF's."""
    ids, tiles = llm.image_prompts.prompt(PROMPT, [picture(2)], "test")
    inputs = hf_inputs(llm, picture(2))
    assert ids == inputs["input_ids"][0].tolist() and len(tiles) == 1
    out, logprobs = greedy_logprobs(llm, picture(2))
    hf, hf_logprobs = hf_generate(hf_model, inputs)
    assert out == hf and np.abs(logprobs - hf_logprobs).max() <= 1e-4


def test_chat_with_image_url(llm, hf_model):
    """LLM.chat puts one <image> for a data: URL image part; the reply is HF's."""
    image = random_image(4, 56)
    (out,) = llm.chat(chat_message(image), GREEDY)
    assert out.prompt == PROMPT
    assert out.outputs[0].token_ids == hf_generate(hf_model, hf_inputs(llm, Image.fromarray(image), out.prompt))[0]


def test_registry_reads_both_architectures(model_dir):
    """Idefics3 and SmolVLM run their text_config's Llama; SmolVLM's config reads the same tower and connector."""
    import json

    hf = json.loads((model_dir / "config.json").read_text())
    smolvlm = {**hf, "architectures": ["SmolVLMForConditionalGeneration"], "model_type": "smolvlm",
               "vision_config": {**hf["vision_config"], "model_type": "smolvlm_vision"}}
    assert {"Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration"} <= set(SUPPORTED_ARCHITECTURES)
    text = from_hf_config({**hf["text_config"], "architectures": ["LlamaForCausalLM"]})
    assert from_hf_config(hf) == from_hf_config(smolvlm) == text
    assert read_vision_language_config(smolvlm) == read_vision_language_config(hf)


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
