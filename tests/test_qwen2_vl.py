"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE against HF transformers on the same tiny weights: text prompts
through the language model (M-RoPE with its three position streams equal is Qwen2's rope), every position's logits
and greedy tokens through LLM.generate; configs nested (transformers 5) and flat (the hub's) read alike. With images:
the tower's rows (Qwen3-VL's DeepStack rows too) and the M-RoPE positions as HF's, every position's logits, greedy
tokens and logprobs through the engine (chunks cutting the image, prefix caching on and off), two images of
different sizes (Qwen3-VL's batched with a text prompt), LLM.chat."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from PIL import Image
from qwen2_vl_models import CLASSES, MROPE_SECTION, hf_video_text, save_tiny_qwen2_vl
from test_llava import chat_message
from vision_models import random_image

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.paged import init_paged_cache
from jaxinfer.cache.ragged_view import RaggedPagedCache
from jaxinfer.config.model import ConfigError
from jaxinfer.entrypoints.qwen_video import as_videos
from jaxinfer.models import forward_with_taps, lm_logits
from jaxinfer.models.embed_override import stacked_override
from jaxinfer.models.registry import SUPPORTED_ARCHITECTURES, from_hf_config
from jaxinfer.runtime.mrope_positions import offsets, total_delta
from jaxinfer.speculative.config import SpeculativeConfig

KINDS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"]
KIND_ARCHITECTURES = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                      "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration")
TEXT = "The quick brown fox jumps over the lazy dog"
GREEDY = SamplingParams(max_tokens=8, temperature=0)
WITH_LOGPROBS = SamplingParams(max_tokens=8, temperature=0, logprobs=0)
IMAGE_PROMPT = "USER: <|vision_start|><|image_pad|><|vision_end|>The quick brown fox ASSISTANT:"
# 16 tokens a step: an 80x48 image's 15 pads (3 x 5 merged blocks, from position 7) are cut across two chunks;
# XLA's attention (not the native CPU kernels): what accelerators compile, and what the lowering test exports
LOGITS_LENGTH = 96  # every sequence our_logits runs (the longest: Qwen3-VL's video prompt) padded to this
KNOBS = dict(dtype="float32", max_seq_len=128, max_num_batched_tokens=16, page_size=4, num_pages=60, max_num_seqs=2,
             limit_mm_per_prompt={"image": 2, "video": 1}, cpu_kernels=False)


@pytest.fixture(scope="module", params=KINDS)
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, kind):
    return save_tiny_qwen2_vl(tmp_path_factory.mktemp(kind), kind)


@pytest.fixture(scope="module")
def hf_model(model_dir, kind):
    return CLASSES[kind][1].from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, **KNOBS)


def first_kind_only(*also: str) -> pytest.MarkDecorator:
    """Checks of what the models share (the language model's wiring, prompts, refusals, the step programs)
    run on Qwen2-VL (and the kinds named) only; the others run those of their own tower and language model
    (image logits, the engine)."""
    return pytest.mark.parametrize("kind", [KINDS[0], *also], indirect=True)


def our_logits(llm: LLM, ids: np.ndarray, placed: np.ndarray | None = None, streams: np.ndarray | None = None
               ) -> np.ndarray:
    """Every position's float32 logits of one sequence through the model (image rows placed at the pads;
    streams [3, 1, T]: M-RoPE's rotary positions, None: all equal to the positions). The sequence is padded to
    LOGITS_LENGTH tokens after its end (causal: its logits are its own), so every check shares the eager ops' shapes."""
    length, pad = len(ids), LOGITS_LENGTH - len(ids)
    ids, positions = np.pad(ids, (0, pad)), np.arange(LOGITS_LENGTH, dtype=np.int32)
    view = RaggedPagedCache(init_paged_cache(llm.config, 1, 128, np.float32, page_size=4), np.zeros(len(ids), np.int32))
    mask = np.isin(ids, [llm.image_prompts.cfg.image_token_id, llm.image_prompts.cfg.video_token_id])
    mask[length:] = False
    override = None if placed is None else stacked_override(np.pad(placed, ((0, pad), (0, 0))), mask,
                                                            llm.config.hidden_size)
    if streams is not None:
        streams = np.concatenate([streams, streams[..., -1:] + np.arange(1, pad + 1)], axis=-1)
    hidden, _, _ = forward_with_taps(llm.weights, ids[None], positions[None], view, llm.config, (), override, streams)
    return np.asarray(lm_logits(llm.weights, hidden))[0, :length]


@first_kind_only()
def test_text_logits_and_greedy_match_hf(llm, hf_model, kind):
    """A text prompt: every position's float32 logits within 1e-5 of the largest, greedy tokens HF's."""
    ids = llm.tokenizer.encode(TEXT)
    with torch.no_grad():
        expected = hf_model(input_ids=torch.tensor([ids])).logits[0].numpy()
        hf_tokens = hf_model.generate(input_ids=torch.tensor([ids]), max_new_tokens=GREEDY.max_tokens,
                                      do_sample=False)[0, len(ids):].tolist()
    assert llm.config.mrope_section == tuple(MROPE_SECTION)
    assert np.abs(our_logits(llm, np.asarray(ids)) - expected).max() <= 1e-5 * np.abs(expected).max()
    assert llm.generate(TEXT, GREEDY)[0].outputs[0].token_ids == hf_tokens


@pytest.mark.parametrize("kind", KINDS[:2], indirect=True)  # Qwen3-VL's configs come nested only
def test_flat_hub_config_reads_as_nested(model_dir, kind):
    """The hub's flat config (text fields at the top, rope_scaling type "mrope") gives the same ModelConfig."""
    nested = json.loads((model_dir / "config.json").read_text())
    text = nested["text_config"]
    flat = {**{k: v for k, v in nested.items() if k != "text_config"}, **text,
            "rope_theta": text["rope_parameters"]["rope_theta"],
            "rope_scaling": {"type": "mrope", "mrope_section": MROPE_SECTION}}
    flat.pop("rope_parameters")
    assert from_hf_config(flat) == from_hf_config(nested)
    assert set(KIND_ARCHITECTURES) <= set(SUPPORTED_ARCHITECTURES)  # named where an unsupported one is refused


def test_bad_mrope_refused(model_dir):
    hf = json.loads((model_dir / "config.json").read_text())
    bad = {**hf, "text_config": {**hf["text_config"], "rope_parameters": {"rope_type": "default",
                                                                          "mrope_section": [2, 3, 4]}}}
    with pytest.raises(ConfigError, match=r"mrope_section \[2, 3, 4\] must add up to the 8"):
        from_hf_config(bad)
    yarn = {**hf, "text_config": {**hf["text_config"], "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}}
    with pytest.raises(ConfigError, match="rope type 'yarn' is not supported for Qwen[23]"):
        from_hf_config(yarn)


def picture(seed: int, width: int = 80, height: int = 48) -> Image.Image:
    """A random image the processor keeps at width x height (multiples of 16: one merged block each)."""
    return Image.fromarray(random_image(seed, 56)).resize((width, height))


def hf_inputs(llm: LLM, images: list[Image.Image], text: str = IMAGE_PROMPT) -> dict:
    """HF's inputs for the prompt as our processor expands it: ids, the same patches, grids and token types."""
    ids, carried = llm.image_prompts.prompt(text, images, "test")
    ids = torch.tensor([ids])
    pixels = np.concatenate([i.pixels.reshape(-1, i.pixels.shape[-1]) for i in carried])
    grids = torch.tensor([[1, 2 * i.pixels.shape[0], 2 * i.pixels.shape[1]] for i in carried])
    return dict(input_ids=ids, pixel_values=torch.tensor(pixels), image_grid_thw=grids,
                mm_token_type_ids=(ids == llm.image_prompts.cfg.image_token_id).int())


def hf_generate(hf_model, inputs: dict) -> tuple[list[int], np.ndarray]:
    """HF's greedy tokens and each one's logprob."""
    with torch.no_grad():
        out = hf_model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False, output_scores=True,
                                return_dict_in_generate=True)
    tokens = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    return tokens, np.asarray([torch.log_softmax(s[0], -1)[t].item() for s, t in zip(out.scores, tokens)])


def greedy_logprobs(llm: LLM, images: list[Image.Image], text: str = IMAGE_PROMPT) -> tuple[list[int], np.ndarray]:
    out = llm.generate({"prompt": text, "multi_modal_data": {"image": images}}, WITH_LOGPROBS)[0].outputs[0]
    return out.token_ids, np.asarray([step[t].logprob for step, t in zip(out.logprobs, out.token_ids)])


def hf_image_rows(hf_model, inputs: dict) -> np.ndarray:
    """HF's rows [tokens, D] of the inputs' one image (Qwen3-VL's DeepStack rows beside: [tokens, (1 + K) * D])."""
    with torch.no_grad():
        features = hf_model.model.get_image_features(pixel_values=inputs["pixel_values"],
                                                     image_grid_thw=inputs["image_grid_thw"])
    deep = getattr(features, "deepstack_features", None) or ()
    # transformers 5.17 splits the main rows by image but not the DeepStack ones: one image, so they are all its own
    return np.concatenate([features.pooler_output[0].numpy(),
                           *[(d if isinstance(d, torch.Tensor) else d[0]).numpy() for d in deep]], 1)


@first_kind_only("qwen2_5_vl", "qwen3_vl")
def test_images_of_sizes_in_one_bucket_share_a_tower_program_and_keep_hf_rows(llm, hf_model, kind):
    """Grids of 3 x 4, 4 x 3, 2 x 5 and 5 x 2 merged blocks, padded to 12 (models/tower_patches): one tower
    program, each image's rows HF's (Qwen2.5-VL's windows cut differently in each)."""
    table = llm.engine.runner.executables.table
    before = len(table)
    for seed, (width, height) in enumerate([(64, 48), (48, 64), (80, 32), (32, 80)]):
        image = picture(10 + seed, width, height)
        (carried,) = llm.image_prompts.prompt(IMAGE_PROMPT, [image], "test")[1]
        expected = hf_image_rows(hf_model, hf_inputs(llm, [image]))
        rows = llm.engine.runner.vision.features(carried)
        assert rows.shape == expected.shape and np.abs(rows - expected).max() <= 1e-5 * np.abs(expected).max()
    assert len(table) == before + 1


def test_image_logits_and_positions_match_hf(llm, hf_model):
    """The tower's rows (Qwen3-VL's DeepStack rows beside), the M-RoPE positions (and the decode delta) and every
    position's float32 logits of a prompt with text after an image; without the image's 3-D positions (Qwen3-VL:
    its DeepStack rows, or its sections interleaved) the logits are not HF's."""
    inputs = hf_inputs(llm, [picture(0)])
    ids = inputs["input_ids"][0].numpy()
    (image,) = llm.image_prompts.prompt(IMAGE_PROMPT, [picture(0)], "test")[1]
    assert (image.offset, image.length, image.pixels.shape[:2]) == (7, 15, (3, 5))
    with torch.no_grad():
        expected = hf_model(**inputs).logits[0].numpy()
        hf_positions, hf_delta = hf_model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                               inputs["image_grid_thw"])
    hf_rows = hf_image_rows(hf_model, inputs)
    rows = llm.engine.runner.vision.features(image)
    assert rows.shape == hf_rows.shape and np.abs(rows - hf_rows).max() <= 1e-5 * np.abs(hf_rows).max()
    positions = np.arange(len(ids), dtype=np.int32)
    streams = (positions[:, None] + offsets((image,), positions)).T[:, None, :]
    assert np.array_equal(streams[:, 0], hf_positions[:, 0].numpy()) and total_delta((image,)) == hf_delta.item()
    placed = np.zeros((len(ids), rows.shape[1]), np.float32)
    placed[image.offset : image.offset + image.length] = rows
    assert np.abs(our_logits(llm, ids, placed, streams) - expected).max() <= 1e-5 * np.abs(expected).max()
    assert np.abs(our_logits(llm, ids, placed) - expected).max() > 1e-2 * np.abs(expected).max()
    if llm.config.mrope_interleaved:  # Qwen3-VL
        text_only = np.where(np.arange(placed.shape[1]) < llm.config.hidden_size, placed, 0)
        assert np.abs(our_logits(llm, ids, text_only, streams) - expected).max() > 1e-2 * np.abs(expected).max()
        llm.config = dataclasses.replace(llm.config, mrope_interleaved=False)
        try:
            assert np.abs(our_logits(llm, ids, placed, streams) - expected).max() > 1e-2 * np.abs(expected).max()
        finally:
            llm.config = dataclasses.replace(llm.config, mrope_interleaved=True)


# Qwen3-VL-MoE: Qwen3-VL's engine run covers the DeepStack rows; the MoE layers' logits are checked above.
@pytest.mark.parametrize("kind", KINDS[:3], indirect=True)
def test_engine_greedy_matches_hf(hf_model, llm, kind):
    """Greedy tokens and logprobs through the engine as HF's (16-token chunks cut the image; decode rotates by
    the image's delta); another image gives other tokens; a rerun hits the prefix cache, its image's pages too.
    (Qwen3-VL-MoE's language model is checked by its image logits: its step programs would cost 13 s to compile.)"""
    (out_a, logprobs_a), (out_b, _) = greedy_logprobs(llm, [picture(0)]), greedy_logprobs(llm, [picture(1)])
    hits = llm.engine.scheduler.prefix_hits
    again = llm.generate({"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": picture(0)}}, GREEDY)
    hf_a, hf_logprobs_a = hf_generate(hf_model, hf_inputs(llm, [picture(0)]))
    assert out_a == hf_a and out_b == hf_generate(hf_model, hf_inputs(llm, [picture(1)]))[0]
    assert np.abs(logprobs_a - hf_logprobs_a).max() <= 1e-4
    assert out_a != out_b and again[0].outputs[0].token_ids == out_a
    assert llm.engine.scheduler.prefix_hits > hits


@first_kind_only()
def test_prompt_logprobs_with_an_image_match_hf(llm, hf_model, kind):
    """prompt_logprobs of an image prompt: HF's log-softmax at every position (the all-positions pass takes the
    image rows and the tokens' rotary offsets)."""
    (out,) = llm.generate({"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": picture(5)}},
                          SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2))
    inputs = hf_inputs(llm, [picture(5)])
    ids = inputs["input_ids"][0]
    with torch.no_grad():
        logits = hf_model(**inputs).logits[0, :-1].double()
    expected = torch.log_softmax(logits, -1).gather(1, ids[1:, None])[:, 0].numpy()
    assert out.prompt_token_ids == ids.tolist() and out.prompt_logprobs[0] is None
    got = [step[token].logprob for step, token in zip(out.prompt_logprobs[1:], ids[1:].tolist())]
    np.testing.assert_allclose(got, expected, atol=1e-4)


@first_kind_only("qwen3_vl")
def test_two_images_of_different_sizes(llm, hf_model, kind):
    """Two images whose pad counts differ (3 x 5 and 2 x 2 merged blocks), text between and after them: HF's
    tokens and logprobs. Qwen3-VL's prompt runs batched with a text prompt in 16-token chunks (the images' rows,
    DeepStack's too, follow their tokens whichever chunk and batch row they land in); the text one's tokens are
    its tokens alone."""
    two = "USER: <|vision_start|><|image_pad|><|vision_end|> and <|vision_start|><|image_pad|><|vision_end|> fox:"
    images = [picture(2), picture(3, 32, 32)]
    _, carried = llm.image_prompts.prompt(two, images, "test")
    assert [i.length for i in carried] == [15, 4]
    hf, hf_logprobs = hf_generate(hf_model, hf_inputs(llm, images, two))
    if kind == "qwen3_vl":
        with_text = llm.generate([{"prompt": two, "multi_modal_data": {"image": images}}, TEXT], WITH_LOGPROBS)
        out = with_text[0].outputs[0].token_ids
        logprobs = np.asarray([step[t].logprob for step, t in zip(with_text[0].outputs[0].logprobs, out)])
        assert with_text[1].outputs[0].token_ids == llm.generate(TEXT, GREEDY)[0].outputs[0].token_ids
    else:
        out, logprobs = greedy_logprobs(llm, images, two)
    assert out == hf and np.abs(logprobs - hf_logprobs).max() <= 1e-4


@first_kind_only()
def test_chat_with_image_url(llm, hf_model, kind):
    """LLM.chat reads a data: URL image part inside the vision start and end tokens; the reply is HF's."""
    image = random_image(4, 56)
    (out,) = llm.chat(chat_message(image), GREEDY)
    assert out.prompt.count("<|vision_start|><|image_pad|><|vision_end|>") == 1
    inputs = hf_inputs(llm, [Image.fromarray(image)], out.prompt)
    assert out.outputs[0].token_ids == hf_generate(hf_model, inputs)[0]


@first_kind_only()
def test_speculation_refused(llm, model_dir, kind):
    with pytest.raises(ConfigError, match="speculative decoding .* not supported for M-RoPE"):
        LLM(model_dir, speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=2), **KNOBS)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
@first_kind_only("qwen3_vl")
def test_steps_with_rope_offsets_lower_for_the_accelerators(llm, kind, platform):
    """The widest ragged step and the decode step, their tokens' rotary offsets among the inputs, lower for CUDA
    and TPU (no accelerator here); Qwen3-VL's ragged step with its DeepStack rows too."""
    from accelerator_programs import EXPORT_PLATFORMS, step_programs
    from jax import export

    runner = llm.engine.runner
    pools = runner.pages, runner.draft  # step_programs gives them the platform's kernels: the engine's back after
    try:
        programs = step_programs(llm, platform)
        for wanted in ("ragged",) if kind == "qwen3_vl" else ("ragged", "decode"):
            program, args, kwargs = [(p, a, k) for shape, p, a, k in programs if shape[0] == wanted][-1]
            export.export(program, platforms=(EXPORT_PLATFORMS[platform],))(*args, **kwargs)
    finally:
        runner.branchless, runner.stop_early = False, True
        runner.pages, runner.draft = pools


VIDEO_PROMPT = "USER: <|vision_start|><|video_pad|><|vision_end|>What happens? ASSISTANT:"
# Qwen2.5-VL's: 4 frames of a 3 fps source sampled every 50th, so its 2 frame groups are 133 temporal positions apart,
# past the text after them (the decode delta comes from the video); the others' frames come without metadata
VIDEO_METADATA = {"qwen2_5_vl": {"fps": 3.0, "frames_indices": [0, 50, 100, 150], "total_num_frames": 200}}


def video_of(seed: int, kind: str) -> np.ndarray | tuple:
    """4 frames of 48 x 80 pixels (kept as they are: 2 frame groups of 3 x 5 merged blocks), with metadata where
    VIDEO_METADATA has some."""
    frames = np.stack([np.asarray(picture(seed + k)) for k in range(4)])
    return (frames, VIDEO_METADATA[kind]) if kind in VIDEO_METADATA else frames


def hf_video_inputs(llm: LLM, kind: str, video: np.ndarray | tuple) -> tuple[dict, tuple]:
    """HF's inputs for the video prompt (its ids from HF's processor text, our patches) and our carried inputs."""
    ids, carried = llm.image_prompts.prompt(VIDEO_PROMPT, [], "test", as_videos(video, "test"))
    frames = [i.pixels.reshape(-1, i.pixels.shape[-1]) for i in carried]
    blocks = carried[0].pixels.shape[-4:-2]
    grid = [len(frames) * len(carried[0].temporal or (0,)), 2 * blocks[0], 2 * blocks[1]]
    metadata = VIDEO_METADATA.get(kind, {})
    text = hf_video_text(kind, VIDEO_PROMPT, grid, metadata.get("fps"), metadata.get("frames_indices", [0, 1, 2, 3]))
    hf_ids = torch.tensor([llm.tokenizer(text)["input_ids"]])
    assert hf_ids[0].tolist() == ids
    inputs = dict(input_ids=hf_ids, pixel_values_videos=torch.tensor(np.concatenate(frames)),
                  video_grid_thw=torch.tensor([grid]),
                  mm_token_type_ids=2 * (hf_ids == llm.image_prompts.cfg.video_token_id).int())
    if kind == "qwen2_5_vl":  # its processor's second_per_grid_ts: temporal_patch_size / the frames' rate
        inputs["second_per_grid_ts"] = torch.tensor([2 / (4 / 200 * 3.0)])
    return inputs, carried


@pytest.mark.parametrize("kind", KINDS[:3], indirect=True)
def test_video_logits_and_positions_match_hf(llm, hf_model, kind):
    """A 4-frame video's prompt ids as HF's processor writes them (Qwen3-VL: a timestamp and its own vision start and
    end per frame group), its rows as HF's get_video_features, the M-RoPE positions as HF's get_rope_index
    (Qwen2.5-VL's frame groups 133 apart), every position's float32 logits within 1e-5 of HF's."""
    inputs, carried = hf_video_inputs(llm, kind, video_of(20, kind))
    ids = inputs["input_ids"][0].numpy()
    with torch.no_grad():
        expected = hf_model(**inputs).logits[0].numpy()
        features = hf_model.model.get_video_features(pixel_values_videos=inputs["pixel_values_videos"],
                                                     video_grid_thw=inputs["video_grid_thw"])
        hf_positions, hf_delta = hf_model.model.get_rope_index(
            inputs["input_ids"], inputs["mm_token_type_ids"], video_grid_thw=inputs["video_grid_thw"],
            **({"second_per_grid_ts": inputs["second_per_grid_ts"]} if kind == "qwen2_5_vl" else {}))
    deep = [(d if isinstance(d, torch.Tensor) else d[0]).numpy() for d in getattr(features, "deepstack_features", None)
            or ()]
    hf_rows = np.concatenate([features.pooler_output[0].numpy(), *deep], 1)
    rows = np.concatenate([llm.engine.runner.vision.features(i) for i in carried])
    assert rows.shape == hf_rows.shape and np.abs(rows - hf_rows).max() <= 1e-5 * np.abs(hf_rows).max()
    positions = np.arange(len(ids), dtype=np.int32)
    streams = (positions[:, None] + offsets(carried, positions)).T[:, None, :]
    assert np.array_equal(streams[:, 0], hf_positions[:, 0].numpy())
    # decode goes on from the last token's position + 1, as HF's generate does; HF's rope_deltas (the largest
    # position + 1) is larger only where the frame groups' temporal positions pass the text after them
    assert total_delta(carried) == streams[:, 0, -1].max() + 1 - len(ids)
    assert (hf_delta.item() > total_delta(carried)) == (kind == "qwen2_5_vl")
    placed = np.zeros((len(ids), rows.shape[1]), np.float32)
    placed[np.isin(ids, [llm.image_prompts.cfg.video_token_id])] = rows
    assert np.abs(our_logits(llm, ids, placed, streams) - expected).max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize("kind", KINDS[:3], indirect=True)
def test_engine_greedy_video_batched_with_an_image(llm, hf_model, kind):
    """A video prompt batched with an image prompt in 16-token chunks (they cut the video): each one's greedy tokens
    HF generate's (the video's logprobs within 1e-4; decode rotated by the video's delta); a rerun of the video is
    served from the prefix cache, keyed by its frames."""
    image_prompt = {"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": picture(0)}}
    video_prompt = {"prompt": VIDEO_PROMPT, "multi_modal_data": {"video": video_of(20, kind)}}
    video_out, image_out = llm.generate([video_prompt, image_prompt], WITH_LOGPROBS)
    tokens = video_out.outputs[0].token_ids
    logprobs = np.asarray([step[t].logprob for step, t in zip(video_out.outputs[0].logprobs, tokens)])
    hf_tokens, hf_logprobs = hf_generate(hf_model, hf_video_inputs(llm, kind, video_of(20, kind))[0])
    assert tokens == hf_tokens and np.abs(logprobs - hf_logprobs).max() <= 1e-4
    assert image_out.outputs[0].token_ids == hf_generate(hf_model, hf_inputs(llm, [picture(0)]))[0]
    hits = llm.engine.scheduler.prefix_hits
    assert llm.generate(video_prompt, GREEDY)[0].outputs[0].token_ids == tokens
    assert llm.engine.scheduler.prefix_hits > hits


@first_kind_only()
def test_video_refusals(llm, kind):
    """More videos than limit_mm_per_prompt, a pad count other than the videos', bad frames, and a chat video_url
    part (no video decoder here) are refused by name."""
    video = {"video": [video_of(0, kind)] * 2}
    with pytest.raises(ValueError, match=r"2 videos in one prompt, more than limit_mm_per_prompt's \{'video': 1\}"):
        llm.generate({"prompt": VIDEO_PROMPT, "multi_modal_data": video}, GREEDY)
    with pytest.raises(ValueError, match=r"marks 0 video\(s\) with '<\|video_pad\|>' and 1 were given"):
        llm.generate({"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": picture(0), "video": video_of(0, kind)}},
                     GREEDY)
    with pytest.raises(TypeError, match=r"multi_modal_data.video must be frames"):
        llm.generate({"prompt": VIDEO_PROMPT, "multi_modal_data": {"video": "clip.mp4"}}, GREEDY)
    part = {"type": "video_url", "video_url": {"url": "file:///clip.mp4"}}
    with pytest.raises(ValueError, match=r"content\[0\]: video_url parts are not supported: .*decoder .*"
                                         r"multi_modal_data\['video'\]"):
        llm.chat([{"role": "user", "content": [part]}], GREEDY)
