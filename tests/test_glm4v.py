"""GLM-4.1V, GLM-4.5V and GLM-4.6V against HF transformers on the same tiny weights (tests/glm4v_models): prompt ids
HF's Glm4vProcessor's for a wide and a tall image; the tower's rows, the M-RoPE positions and every position's float32
logits of an image prompt HF's for each architecture; greedy tokens through the engine HF generate's for two image
prompts batched with a text prompt (GLM-4.1V); refusals by name."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
import torch
from glm4v_models import KINDS, MROPE_SECTION, hf_processor, save_tiny_glm4v
from PIL import Image
from safetensors.torch import load_file, save_file
from vision_models import random_image

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.paged import init_paged_cache
from jaxinfer.cache.ragged_view import RaggedPagedCache
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.config.model import ConfigError
from jaxinfer.entrypoints.multimodal import ImagePrompts, load_vision
from jaxinfer.models import forward_with_taps, lm_logits
from jaxinfer.models.embed_override import stacked_override
from jaxinfer.models.registry import SUPPORTED_ARCHITECTURES, from_hf_config
from jaxinfer.models.tower_patches import tower_patches
from jaxinfer.models.vision_language import image_features
from jaxinfer.runtime.mrope_positions import offsets, total_delta

PROMPT = "USER: <|begin_of_image|><|image|><|end_of_image|>The quick brown fox"
TWO = "<|begin_of_image|><|image|><|end_of_image|> and <|begin_of_image|><|image|><|end_of_image|> fox"
TEXT = "The quick brown fox jumps over the lazy dog"
GREEDY = SamplingParams(max_tokens=6, temperature=0)


def picture(seed: int, width: int, height: int) -> Image.Image:
    """A random image the processor keeps within 64 x 64 pixels (96 x 40 -> 96 x 32: 2 x 6 merged blocks)."""
    return Image.fromarray(random_image(seed, 56)).resize((width, height))


WIDE, TALL = picture(0, 96, 40), picture(1, 40, 96)


@pytest.fixture(scope="module", params=list(KINDS))
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, kind):
    return save_tiny_glm4v(tmp_path_factory.mktemp(kind), kind)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, hf_dir, kind):
    """The checkpoint we read: one tensor per expert, as transformers saves Glm4vMoe's (and GLM-4.5V's checkpoints
    hold them); transformers saves Glm46V's experts fused, and reads only those (HF's reference loads them)."""
    if kind != "glm46v":
        return hf_dir
    path = tmp_path_factory.mktemp("glm46v_hub")
    shutil.copytree(hf_dir, path, dirs_exist_ok=True)
    one_tensor_per_expert(path / "model.safetensors")
    return path


@pytest.fixture(scope="module")
def hf_model(hf_dir, kind):
    return KINDS[kind][1].from_pretrained(hf_dir).eval()


@pytest.fixture(scope="module")
def loaded(model_dir):
    """(config, weights, tower config, tower weights, image prompts) read as the engine reads them."""
    cfg, weights = load_weights(model_dir, np.float32, progress=False)
    vision_cfg, tower = load_vision(model_dir, np.float32)
    import transformers

    prompts = ImagePrompts(model_dir, vision_cfg, transformers.AutoTokenizer.from_pretrained(model_dir), 4)
    return cfg, weights, vision_cfg, tower, prompts


def one_tensor_per_expert(file) -> None:
    """Rewrite transformers' fused experts (gate_up_proj [E, 2F, D], down_proj [E, D, F]) as one Linear each."""
    out = {}
    for name, tensor in load_file(file).items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            base, half = name[: -len("gate_up_proj")], tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = tensor[e, :half].contiguous()
                out[f"{base}{e}.up_proj.weight"] = tensor[e, half:].contiguous()
        elif name.endswith(".mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(tensor.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = tensor[e].contiguous()
        else:
            out[name] = tensor
    save_file(out, file, metadata={"format": "pt"})


def first_kind_only() -> pytest.MarkDecorator:
    """Checks of what the three share (prompts, the engine's wiring, refusals) run on GLM-4.1V only."""
    return pytest.mark.parametrize("kind", ["glm4v"], indirect=True)


@first_kind_only()
def test_prompt_ids_are_hf_processors(model_dir, loaded, kind):
    """A wide and a tall image in one prompt: each <|image|> expanded to its 2 x 6 / 6 x 2 merged blocks, HF's ids."""
    prompts = loaded[4]
    ids, images = prompts.prompt(TWO, [WIDE, TALL], "test")
    expected = hf_processor(model_dir)(text=[TWO], images=[WIDE, TALL], return_tensors="np")
    assert ids == expected["input_ids"][0].tolist()
    assert [(i.length, i.pixels.shape[:2]) for i in images] == [(12, (2, 6)), (12, (6, 2))]
    assert expected["image_grid_thw"].tolist() == [[1, 4, 12], [1, 12, 4]]


def hf_inputs(model_dir, images: list[Image.Image], text: str = PROMPT) -> dict:
    out = hf_processor(model_dir)(text=[text], images=images, return_tensors="pt")
    return {k: out[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids")}


def our_logits(loaded, ids: np.ndarray, placed: np.ndarray, streams: np.ndarray) -> np.ndarray:
    """Every position's float32 logits of one sequence (image rows placed at the pads; streams [3, 1, T])."""
    cfg, weights, vision_cfg = loaded[:3]
    positions = np.arange(len(ids), dtype=np.int32)
    view = RaggedPagedCache(init_paged_cache(cfg, 1, 64, np.float32, page_size=4), np.zeros(len(ids), np.int32))
    override = stacked_override(placed, ids == vision_cfg.image_token_id, cfg.hidden_size)
    hidden, _, _ = forward_with_taps(weights, ids[None], positions[None], view, cfg, (), override, streams)
    return np.asarray(lm_logits(weights, hidden))[0]


def test_image_logits_and_positions_match_hf(model_dir, hf_model, loaded, kind):
    """The tower's rows (a wide image's 2 x 6 blocks padded to 12), the M-RoPE positions and delta, and every
    position's float32 logits of a prompt with text after the image, HF's; with text positions for the image, not."""
    cfg, _, vision_cfg, tower, prompts = loaded
    inputs = hf_inputs(model_dir, [WIDE])
    ids, (image,) = prompts.prompt(PROMPT, [WIDE], "test")
    assert ids == inputs["input_ids"][0].tolist() and cfg.mrope_section == tuple(MROPE_SECTION)
    with torch.no_grad():
        expected = hf_model(**inputs).logits[0].numpy()
        hf_rows = hf_model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output[0]
        hf_positions, hf_delta = hf_model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                               inputs["image_grid_thw"])
    patches = tower_patches(image.pixels, vision_cfg.vision.merge, 0, vision_cfg.vision.grid_side, True)
    rows = np.asarray(jax.jit(image_features, static_argnames="cfg")(tower, patches, cfg=vision_cfg))[0, :12]
    assert np.abs(rows - hf_rows.numpy()).max() <= 1e-5 * np.abs(hf_rows.numpy()).max()
    positions = np.arange(len(ids), dtype=np.int32)
    streams = (positions[:, None] + offsets((image,), positions)).T[:, None, :]
    assert np.array_equal(streams[:, 0], hf_positions[:, 0].numpy()) and total_delta((image,)) == hf_delta.item()
    placed = np.zeros((len(ids), cfg.hidden_size), np.float32)
    placed[image.offset : image.offset + image.length] = rows
    scale = np.abs(expected).max()
    assert np.abs(our_logits(loaded, np.asarray(ids), placed, streams) - expected).max() <= 1e-5 * scale
    text_streams = np.broadcast_to(positions, (3, 1, len(ids)))
    assert np.abs(our_logits(loaded, np.asarray(ids), placed, text_streams) - expected).max() > 1e-2 * scale


@first_kind_only()
def test_engine_greedy_matches_hf_for_image_and_text_prompts(model_dir, hf_model, kind):
    """A wide-image prompt, a tall-image prompt and a text prompt batched through the engine (one prefill step,
    then decode steps rotated by each image's delta): each one's greedy tokens HF generate's for it alone."""
    llm = LLM(model_dir, dtype="float32", max_seq_len=64, max_num_batched_tokens=128, max_num_seqs=4,
              limit_mm_per_prompt={"image": 2})
    outs = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": WIDE}},
                         {"prompt": PROMPT, "multi_modal_data": {"image": TALL}}, TEXT], GREEDY)
    with torch.no_grad():
        for out, image in zip(outs, (WIDE, TALL)):
            inputs = hf_inputs(model_dir, [image])
            hf = hf_model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False)
            assert out.outputs[0].token_ids == hf[0, inputs["input_ids"].shape[1]:].tolist()
        ids = llm.tokenizer.encode(TEXT)
        hf = hf_model.generate(input_ids=torch.tensor([ids]), max_new_tokens=GREEDY.max_tokens, do_sample=False)
    assert outs[2].outputs[0].token_ids == hf[0, len(ids):].tolist()
    assert outs[0].outputs[0].token_ids != outs[1].outputs[0].token_ids
    with pytest.raises(ValueError, match=r"served modalities are \('image',\), got \['video'\]"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"video": [WIDE]}}, GREEDY)


@first_kind_only()
def test_refused_by_name(model_dir, kind):
    """A GLM-4.6V text_config of another model type, a tower whose rows are not the language model's width, another
    vision rope; the three architectures are named where an unsupported one is refused."""
    hf = json.loads((model_dir / "config.json").read_text())
    other = {**hf, "architectures": ["Glm46VForConditionalGeneration"],
             "text_config": {**hf["text_config"], "model_type": "qwen2"}}
    with pytest.raises(ConfigError, match="text_config.model_type 'qwen2' is not supported for Glm46V"):
        from_hf_config(other)
    from jaxinfer.models.glm4v_vision import read_glm4v_config

    narrow = {**hf, "vision_config": {**hf["vision_config"], "out_hidden_size": 32}}
    with pytest.raises(ConfigError, match="out_hidden_size 32 must be the language model's hidden_size 64"):
        read_glm4v_config(narrow)
    rope = {**hf, "vision_config": {**hf["vision_config"], "rope_parameters": {"rope_type": "default"}}}
    with pytest.raises(ConfigError, match="rope_type 'default' is not supported; supported: axial"):
        read_glm4v_config(rope)
    assert {model_class.__name__ for _, model_class, _, _ in KINDS.values()} <= set(SUPPORTED_ARCHITECTURES)
