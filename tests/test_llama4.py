"""Llama 4 beyond test_hf_parity's logits: chunked attention through the engine's chunked prefill and prefix
cache, and the text model of a Llama4ForConditionalGeneration checkpoint as Meta ships it."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import transformers
from hf_models import ARCH_CONFIGS, COMMON, make_hf_model

from jaxinfer import LLM, SamplingParams

PROMPT = np.random.RandomState(0).randint(3, 256, size=64).tolist()
# Two prompts sharing 22 tokens: with pages of 4 the second hits 5 cached pages, its prefill starting at 20,
# mid-chunk (chunks of 8: positions 16..23), and both cross several chunk boundaries.
SHARED = PROMPT[:22]
PROMPTS = [SHARED + PROMPT[40:45], SHARED + PROMPT[50:61]]
VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32,
              patch_size=16, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)


def hf_greedy(prompt: list[int], tokens: int) -> list[int]:
    """HF's greedy tokens after `prompt` (its chunked mask built from the cache's positions at each step)."""
    with torch.no_grad():
        out = make_hf_model("llama4").generate(torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False,
                                               eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_chunked_prefill_and_prefix_cache_keep_hf_greedy_tokens(checkpoint_dir):
    """Prefill chunks of 6 tokens (cutting attention chunks of 8); one sequence at a time, so the second prompt
    finds the first's pages cached and its prefill starts mid-chunk; decode crossing chunk boundaries: HF's
    greedy tokens."""
    llm = LLM(checkpoint_dir("llama4"), dtype="float32", max_seq_len=64, page_size=4, max_num_batched_tokens=6,
              max_num_seqs=1, enable_prefix_caching=True)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == [hf_greedy(p, 10) for p in PROMPTS]
    assert llm.metrics()["prefix_cache_hits"] == 20  # tokens: the 5 pages of positions 0..19


def test_pallas_kernels_keep_hf_greedy_tokens(checkpoint_dir):
    """The chunks inside the Triton kernels (interpreted): the ragged kernel's prefill of 27 tokens across three
    chunk boundaries, the decode kernel's rows as they cross the fourth (position 32)."""
    llm = LLM(checkpoint_dir("llama4"), dtype="float32", max_seq_len=64, attention_backend="pallas",
              interpret_kernels=True)
    params = SamplingParams(max_tokens=7, temperature=0, ignore_eos=True)
    assert llm.generate([PROMPTS[0]], params)[0].outputs[0].token_ids == hf_greedy(PROMPTS[0], 7)


def test_conditional_generation_checkpoint_runs_its_language_model(tmp_path, caplog):
    """Meta's layout: the text model under `language_model.`, a vision tower and projector beside it (skipped,
    one log line); the text config nested under text_config. Logits as HF's model gives them for text."""
    config_cls, extra = ARCH_CONFIGS["llama4"]
    text = config_cls(**{**COMMON, **extra}).to_dict()
    torch.manual_seed(0)
    hf = transformers.Llama4ForConditionalGeneration(transformers.Llama4Config(text_config=text,
                                                                              vision_config=VISION)).eval()
    hf.save_pretrained(tmp_path)
    with torch.no_grad():  # transformers 5.24's own forward fails on text alone (image_outputs): its text model's
        expected = hf.language_model(input_ids=torch.tensor([PROMPT])).logits[0].numpy()
    with caplog.at_level(logging.INFO, logger="jaxinfer.models.text_part"):
        llm = LLM(tmp_path, dtype="float32", max_seq_len=128)
    assert [r.getMessage() for r in caplog.records if "vision tower" in r.getMessage()] == [
        "Llama4ForConditionalGeneration: 26 vision tower and projector tensors skipped; the language model runs "
        "alone (text in, text out: images are not supported)"]
    got = llm.logits(PROMPT)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    image = {"prompt_token_ids": PROMPT[:8], "multi_modal_data": {"image": np.zeros((32, 32, 3), np.uint8)}}
    with pytest.raises(ValueError, match="takes no images"):  # its vision tower is not run
        llm.generate(image, SamplingParams(max_tokens=1))
