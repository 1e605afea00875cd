"""Multimodal checkpoints whose language model runs text-only, beyond test_hf_parity's float32 logits of each (Kimi
K2.5 as transformers saves Kimi_K25ForConditionalGeneration): the layouts their makers ship, read to the same
weights, and their images and video refused by name. No step program is compiled."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
import torch
from hf_models import hf, make_hf_model
from safetensors.numpy import load_file, save_file

from jaxinfer import LLM, SamplingParams
from jaxinfer.checkpoint.loader import load_weights

PROMPT = np.random.RandomState(0).randint(3, 256, size=16).tolist()


def assert_same_weights(ours, theirs) -> None:
    """Every leaf of two weight trees equal."""
    assert len(jax.tree.leaves(ours)) == len(jax.tree.leaves(theirs))
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_kimi_k25_as_moonshot_ships_it(tmp_path, checkpoint_dir):
    """Moonshot's layout (`language_model.model.layers.*`, `mm_projector.*`; the hub's architecture name, the text
    config's model_type kimi_k2) holds what transformers' save (`language_model.model.blocks.*`) does: transformers
    reads it to the same logits, jaxinfer to the same weights."""
    saved = checkpoint_dir("kimi_k25")
    tensors = {name.replace("language_model.model.blocks.", "language_model.model.layers.")
               .replace("model.mm_projector.", "mm_projector."): array
               for name, array in load_file(saved / "model.safetensors").items()}
    assert "language_model.lm_head.weight" in tensors and not any(n.startswith("model.") for n in tensors)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((saved / "config.json").read_text())
    config["text_config"]["model_type"] = "kimi_k2"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with torch.no_grad():
        reference = make_hf_model("kimi_k25")(torch.tensor([PROMPT])).logits
        theirs = hf.Kimi_K25ForConditionalGeneration.from_pretrained(tmp_path).eval()(torch.tensor([PROMPT])).logits
    torch.testing.assert_close(theirs, reference, rtol=0, atol=0)
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["KimiK25ForConditionalGeneration"]}))
    cfg, weights = load_weights(tmp_path, np.float32, progress=False)
    saved_cfg, saved_weights = load_weights(saved, np.float32, progress=False)
    assert cfg == dataclasses.replace(saved_cfg, architecture="KimiK25ForConditionalGeneration")
    assert saved_cfg.tie_word_embeddings is False
    assert_same_weights(weights, saved_weights)


def test_kimi_k25_images_and_video_are_refused(checkpoint_dir):
    """Its tower is not run: a prompt with an image or a video is refused before it is scheduled."""
    llm = LLM(checkpoint_dir("kimi_k25"), dtype="float32", max_seq_len=64)
    image = np.zeros((32, 32, 3), np.uint8)
    for kind, data, match in (("image", image, "takes no images"), ("video", np.stack([image] * 2), "video")):
        with pytest.raises(ValueError, match=match):
            llm.generate({"prompt_token_ids": PROMPT, "multi_modal_data": {kind: data}}, SamplingParams(max_tokens=1))
