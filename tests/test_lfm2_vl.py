"""LiquidAI LFM2-VL's language model run text-only (models/lfm2, models/text_part): a tiny
Lfm2VlForConditionalGeneration (a SigLIP2 tower and projector, never read, beside test_hybrid_families' LFM2, at its
engine knobs: the same step programs) as transformers 5.24 saves it, against transformers' text-only forward and
greedy generate; an image refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from test_hybrid_families import LFM2, PROMPT

from jaxinfer import LLM, SamplingParams

TOWER = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, patch_size=4,
             num_patches=16, vision_use_head=False)
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)  # transformers' LFM2 conv is its slow path


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> tuple[torch.nn.Module, object]:
    """(HF's Lfm2VlForConditionalGeneration, its saved directory); 1-d parameters moved off their init values."""
    torch.manual_seed(0)
    config = transformers.Lfm2VlConfig(text_config={**LFM2, "model_type": "lfm2"}, vision_config=TOWER,
                                       projector_hidden_size=32, image_token_id=250)
    model = transformers.Lfm2VlForConditionalGeneration(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(0.1 * torch.randn_like(param))
    path = tmp_path_factory.mktemp("lfm2_vl")
    model.save_pretrained(path)
    return model, path


def test_text_runs_as_transformers_and_images_are_refused(hf_model):
    """Logits within 1e-5 of the largest and greedy tokens of two prompts batched as transformers' text-only path;
    an image refused by the engine's check."""
    model, path = hf_model
    llm = LLM(str(path), dtype="float32", max_seq_len=64, max_num_seqs=2, max_num_batched_tokens=16, num_pages=5,
              cpu_kernels=False)
    prompts = [PROMPT[2:30], PROMPT[5:14]]  # the first and PROMPT's logits: test_hybrid_families' LFM2 shapes too
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([PROMPT])).logits[0].numpy()
        hf_tokens = [model.generate(torch.tensor([p]), max_new_tokens=GREEDY.max_tokens, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    got = llm.logits(PROMPT)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == hf_tokens
    image = {"prompt_token_ids": prompts[1], "multi_modal_data": {"image": np.zeros((16, 16, 3), np.uint8)}}
    with pytest.raises(ValueError, match="takes no images"):
        llm.generate(image, GREEDY)
