"""Llama 3.2 Vision's language model run text-only (models/mllama): a tiny MllamaForConditionalGeneration (two text
layers, the second a cross-attention layer) as transformers 5.24 saves it (Meta's layout: `language_model.*` beside
`vision_model.*` and `multi_modal_projector.*`) against transformers' text-only forward and greedy generate, which
skip the cross-attention layer; a MllamaForCausalLM checkpoint likewise; images and the `<|image|>` id refused."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import transformers
from mllama_models import TEXT, VOCAB, gated, make_mllama

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import from_hf_config

PROMPTS = [np.random.RandomState(k).randint(3, VOCAB, size=n).tolist() for k, n in ((0, 16), (1, 9))]


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory) -> tuple[torch.nn.Module, object]:
    """(HF's MllamaForConditionalGeneration, its saved directory)."""
    model = make_mllama()
    path = tmp_path_factory.mktemp("mllama")
    model.save_pretrained(path)
    return model, path


def test_conditional_generation_runs_text_as_transformers(vision_model, caplog):
    """Logits within 1e-5 of the largest and greedy tokens (two prompts batched) as transformers' text-only path;
    the tower's tensors skipped in one log line; an image refused by name."""
    model, path = vision_model
    with caplog.at_level(logging.INFO, logger="jaxinfer.models.text_part"):
        llm = LLM(path, dtype="float32", max_seq_len=64)
    assert any("MllamaForConditionalGeneration: " in r.getMessage() and "images are not supported" in r.getMessage()
               for r in caplog.records)
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([PROMPTS[0]])).logits[0].numpy()
        hf_tokens = [model.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False)[0, len(p):].tolist()
                     for p in PROMPTS]
    got = llm.logits(PROMPTS[0])
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0))
    assert [o.outputs[0].token_ids for o in outs] == hf_tokens
    image = {"prompt_token_ids": [1, VOCAB] + PROMPTS[1], "multi_modal_data": {"image": np.zeros((28, 28, 3),
                                                                                                 np.uint8)}}
    with pytest.raises(ValueError, match="takes no images .jaxinfer runs MllamaForConditionalGeneration's language"):
        llm.generate(image, SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match=rf"ids \[{VOCAB}\] outside the vocabulary"):  # <|image|> is vocab_size
        llm.generate({"prompt_token_ids": [1, VOCAB] + PROMPTS[1]}, SamplingParams(max_tokens=1))


def test_causal_lm_checkpoint(tmp_path):
    """MllamaForCausalLM (the text model alone: `model.layers.*`, `lm_head.*`): logits as transformers'."""
    torch.manual_seed(1)
    model = gated(transformers.MllamaForCausalLM(transformers.MllamaTextConfig(**TEXT))).eval()
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([PROMPTS[1]])).logits[0].numpy()
    got = LLM(tmp_path, dtype="float32", max_seq_len=64).logits(PROMPTS[1])
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_config_refusals():
    """cross_attention_layers outside the model refused by name; the cross layers keep no K/V pages."""
    text = {**TEXT, "architectures": ["MllamaForCausalLM"]}
    assert from_hf_config(text).mlp_only_layers == (1,)
    with pytest.raises(ConfigError, match=r"cross_attention_layers \[2\]"):
        from_hf_config({**text, "cross_attention_layers": [2]})
