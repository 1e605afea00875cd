"""PaliGemma and PaliGemma 2 against HF transformers on the same tiny weights and pixels: the prompt as HF's
PaliGemmaProcessor lays it out, every position's logits with the whole prompt one bidirectional prefix, greedy tokens
through the engine (two prompts batched, whole prompts per chunk, a repeat from the prefix cache, the same image
with other text sharing no page), and what is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from paligemma_models import PATCHES, WINDOW, hf_processor, save_tiny_paligemma
from PIL import Image
from vision_models import random_image

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.paged import init_paged_cache
from jaxinfer.cache.ragged_view import RaggedPagedCache
from jaxinfer.config.beam_search import BeamSearchParams
from jaxinfer.engine.scheduler import whole_span_count
from jaxinfer.models import forward_with_taps, lm_logits
from jaxinfer.models.embed_override import EmbedOverride
from jaxinfer.models.vision_language import image_features
from jaxinfer.runtime.image_input import whole_prompt_keys

# Each token's logprob is checked too (a causal prefix gives the tiny model's greedy tokens but moves their logprobs
# by ~0.1)
GREEDY = SamplingParams(max_tokens=10, temperature=0, logprobs=0)
# 24 tokens a step: two 16-token prompts never share one, so the second waits for a step it fits whole
KNOBS = dict(dtype="float32", max_seq_len=64, max_num_batched_tokens=24, page_size=4, num_pages=40, max_num_seqs=2)
PROMPTS = ("caption en", "the quick fox")


def tiny(tmp_path_factory, gemma2: bool) -> tuple:
    """(checkpoint dir, HF model, our LLM) of a tiny PaliGemma (Gemma) or PaliGemma 2 (Gemma 2)."""
    path = save_tiny_paligemma(tmp_path_factory.mktemp("gemma2" if gemma2 else "gemma"), gemma2=gemma2)
    hf = transformers.PaliGemmaForConditionalGeneration.from_pretrained(path, attn_implementation="eager").eval()
    return path, hf, LLM(path, **KNOBS)


@pytest.fixture(scope="module")
def paligemma(tmp_path_factory):
    return tiny(tmp_path_factory, gemma2=False)


@pytest.fixture(scope="module")
def paligemma2(tmp_path_factory):
    return tiny(tmp_path_factory, gemma2=True)


@pytest.fixture(params=["paligemma", "paligemma2"])
def family(request):
    return request.getfixturevalue(request.param)


def hf_inputs(path, image: np.ndarray, text: str) -> dict:
    """HF's processor's inputs: ids, pixels and token_type_ids (0: the prefix)."""
    return dict(hf_processor(path)(images=Image.fromarray(image), text=text, return_tensors="pt"))


def hf_greedy(hf, inputs: dict) -> tuple[list[int], np.ndarray]:
    """HF's greedy tokens and each one's logprob."""
    with torch.no_grad():
        out = hf.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False, output_scores=True,
                          return_dict_in_generate=True)
    tokens = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    return tokens, np.asarray([torch.log_softmax(score[0], -1)[t].item() for score, t in zip(out.scores, tokens)])


def ours(output) -> tuple[list[int], np.ndarray]:
    """Our greedy tokens and each one's logprob, from a RequestOutput."""
    out = output.outputs[0]
    return out.token_ids, np.asarray([step[t].logprob for step, t in zip(out.logprobs, out.token_ids)])


def same(got: tuple[list[int], np.ndarray], expected: tuple[list[int], np.ndarray]) -> bool:
    """The same tokens, their logprobs within 1e-4."""
    return got[0] == expected[0] and np.abs(got[1] - expected[1]).max() <= 1e-4


def our_logits(llm: LLM, ids: list[int], rows: np.ndarray, ends: int) -> np.ndarray:
    """Every position's logits through the ragged step's attention, the image's rows first, each token's key end
    `ends` (-len(ids): the whole prompt, window aside, as the engine runs it; 0: causal; len(ids): the prompt but
    within the window, Gemma 3's way)."""
    placed = np.zeros((len(ids), rows.shape[1]), np.float32)
    placed[:PATCHES] = rows
    ends = np.full(len(ids), ends, np.int32)
    pages = init_paged_cache(llm.config, 1, 64, np.float32, page_size=4)
    view = RaggedPagedCache(pages, np.zeros(len(ids), np.int32), ends)
    override = EmbedOverride(placed, np.arange(len(ids)) < PATCHES)
    positions = np.arange(len(ids), dtype=np.int32)[None]
    hidden, _, _ = forward_with_taps(llm.weights, np.asarray([ids]), positions, view, llm.config, (), override)
    return np.asarray(lm_logits(llm.weights, hidden))[0]


def test_logits_match_hf(family):
    """The prompt is HF's processor's; the image rows and every position's float32 logits are HF's with the whole
    prompt one bidirectional prefix (token_type_ids 0), on PaliGemma 2's sliding layer too (its window is shorter
    than the prompt: HF's prefix sees past it); a causal prompt is far off, and so, for PaliGemma 2, is the prefix
    seen within the window."""
    path, hf, llm = family
    image = random_image(0)
    inputs = hf_inputs(path, image, PROMPTS[0])
    ids, (found,) = llm.image_prompts.prompt(PROMPTS[0], [Image.fromarray(image)], "test")
    assert ids == inputs["input_ids"][0].tolist() and (found.offset, found.length) == (0, PATCHES)
    assert not inputs["token_type_ids"].any()
    with torch.no_grad():
        expected = hf(**inputs).logits[0].numpy()
        hf_rows = hf.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output[0].numpy()
    vision = llm.image_prompts.cfg
    rows = np.asarray(image_features(llm.engine.runner.vision.weights, found.pixels[None], vision))[0]
    assert np.abs(rows - hf_rows).max() <= 1e-5 * np.abs(hf_rows).max()
    got = our_logits(llm, ids, rows, -len(ids))
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    causal = our_logits(llm, ids, rows, 0)
    assert np.abs(causal - expected).max() > 1e-2 * np.abs(expected).max()
    if llm.config.layer_windows[0]:
        assert llm.config.layer_windows[0] == WINDOW < len(ids)
        windowed = our_logits(llm, ids, rows, len(ids))
        assert np.abs(windowed - expected).max() > 1e-2 * np.abs(expected).max()


def test_engine_greedy_matches_hf(paligemma2):
    """Two prompts batched give HF generate's tokens each (the second waits for a step its whole prompt fits; both
    are longer than the sliding window); a repeat is served from the prefix cache beside the same image
    with other text, which shares no page (its image tokens saw other text) and gives HF's tokens. The language
    model is PaliGemma 2's (Gemma 2); PaliGemma's Gemma takes the same steps (its logits are checked above)."""
    path, hf, llm = paligemma2
    a, b = random_image(1), random_image(2)
    prompts = [{"prompt": text, "multi_modal_data": {"image": image}} for text, image in zip(PROMPTS, (a, b))]
    outs = [ours(o) for o in llm.generate(prompts, GREEDY)]
    for got, text, image in zip(outs, PROMPTS, (a, b)):
        assert same(got, hf_greedy(hf, hf_inputs(path, image, text)))
    same_image = {"prompt": PROMPTS[1], "multi_modal_data": {"image": a}}
    again, other = llm.generate([prompts[0], same_image], GREEDY)
    assert same(ours(again), outs[0]) and again.num_cached_tokens > 0
    assert same(ours(other), hf_greedy(hf, hf_inputs(path, a, PROMPTS[1]))) and other.num_cached_tokens == 0


def test_refused_by_name(paligemma2):
    """A prompt longer than a step, prompt_logprobs, beam search and token ids without HF's expanded image tokens
    are refused by name."""
    _, _, llm = paligemma2
    image = {"image": random_image(3)}
    long = {"prompt": "the quick brown fox jumps", "multi_modal_data": image}  # 31 tokens
    with pytest.raises(ValueError, match="more than max_num_batched_tokens 24, .*one bidirectional prefix"):
        llm.generate(long, GREEDY)
    prompt = {"prompt": PROMPTS[0], "multi_modal_data": image}
    with pytest.raises(ValueError, match="prompt_logprobs is not served on this model"):
        llm.generate(prompt, SamplingParams(max_tokens=1, prompt_logprobs=1))
    with pytest.raises(ValueError, match="beam search is not served for PaliGemma"):
        llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=2))
    with pytest.raises(ValueError, match="4 '<image>' tokens per image"):
        llm.generate({"prompt_token_ids": [1, 5, 6], "multi_modal_data": image}, GREEDY)


def test_whole_prompt_chunks_and_keys():
    """A chunk ends before the prompt's end or waits; the prompt's pages are keyed by all of it."""
    prompt = [(0, 16)]
    assert whole_span_count(prompt, 0, 12) == 0 and whole_span_count(prompt, 0, 20) == 20
    assert whole_span_count(prompt, 8, 8) == 8 and whole_span_count(prompt, 16, 3) == 3
    keys = whole_prompt_keys([7, 8, 9, 10], 3)
    assert keys[1:] == [8, 9, 10] and keys[0] != whole_prompt_keys([7, 8, 5, 10], 3)[0]
    assert keys[0] == whole_prompt_keys([7, 8, 9, 11], 3)[0]  # generated tokens are not the prompt
