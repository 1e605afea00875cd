"""Gemma 3n (text) beyond test_hf_parity's logits and bfloat16 runs: the engine's greedy tokens with a prefix-cache
hit against HF's, the KV-sharing layers keeping no pages, the language model of a Gemma3nForConditionalGeneration
checkpoint, images and audio refused, and the settings refused by name. One LLM for the module."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
import torch
import transformers
from hf_models import ARCH_CONFIGS, COMMON, make_hf_model
from safetensors.numpy import load_file, save_file

from jaxinfer import LLM, SamplingParams
from jaxinfer.cache.paged import page_bytes
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.config.gemma3n import Gemma3nFields
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import from_hf_config

PROMPT = np.random.RandomState(0).randint(3, 256, size=64).tolist()
# Two prompts sharing 20 tokens (a full page of 16), both longer than the window (8), both with ids past the
# per-layer table (200); one step shape for both prefills.
PROMPTS = [PROMPT[:20] + PROMPT[40:44], PROMPT[:20] + PROMPT[44:60]]


@pytest.fixture(scope="module")
def llm(checkpoint_dir) -> LLM:
    """One sequence at a time (fewer step programs to compile), so the second prompt finds the first's page."""
    return LLM(checkpoint_dir("gemma3n"), dtype="float32", max_seq_len=128, max_num_seqs=1, enable_prefix_caching=True)


def test_engine_greedy_matches_hf_with_a_prefix_cache_hit(llm):
    """Paged decoding past the window, the second prompt from the first's cached page (the storing layers' K/V
    only): HF's greedy tokens for both."""
    hf_model = make_hf_model("gemma3n")
    with torch.no_grad():
        expected = [hf_model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                                      pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert llm.metrics()["prefix_cache_hits"] == 16


def test_kv_sharing_layers_keep_no_pages(llm):
    """Layers 2 and 3 read layers 0 and 1's pages (the last sliding and global layers before them): a page's
    bytes (K and V, 16 float32 rows of 2 kv heads of 16 dims) count layers 0 and 1 only."""
    cfg = llm.config
    assert [cfg.kv_source(i) for i in range(4)] == [0, 1, 0, 1]
    assert page_bytes(cfg, 16, np.float32) == 2 * 16 * 4 * 2 * (2 * 16)


def test_images_and_audio_are_refused(llm):
    """The checkpoint's towers are not run: a prompt with an image or audio is refused before it is scheduled."""
    image, audio = np.zeros((32, 32, 3), np.uint8), (np.zeros(1600), 16_000)
    refusals = (("image", image, "takes no images"), ("audio", audio, "no vision or audio tower, so it takes text"))
    for kind, data, match in refusals:
        with pytest.raises(ValueError, match=match):
            llm.generate({"prompt_token_ids": PROMPT[:8], "multi_modal_data": {kind: data}},
                         SamplingParams(max_tokens=1))


def test_conditional_generation_checkpoint_reads_its_language_model(tmp_path, checkpoint_dir):
    """Google's layout: `model.language_model.*` beside the vision and audio towers and their embedders, and the
    KV-sharing layers' k/v tensors (all skipped), the text config under text_config. transformers builds
    Gemma3nForConditionalGeneration's vision tower with timm, which the suite does not install, so the checkpoint is
    the causal LM's tensors renamed as Google stores them."""
    causal_dir = checkpoint_dir("gemma3n")
    tensors = {name.replace("model.", "model.language_model.", 1): array
               for name, array in load_file(causal_dir / "model.safetensors").items()}
    towers = {f"model.{part}.weight": np.zeros((2, 2), np.float32) for part in ("vision_tower.timm_model.conv_stem",
                                                                                 "embed_vision.embedding",
                                                                                 "audio_tower.conformer.0.norm",
                                                                                 "embed_audio.embedding")}
    # Google's releases also ship the KV-sharing layers' k/v projections and k norm, which nothing reads
    redundant = {f"model.language_model.layers.{i}.self_attn.{name}.weight": tensors[
        f"model.language_model.layers.{i - 2}.self_attn.{name}.weight"] for i in (2, 3)
        for name in ("k_proj", "v_proj", "k_norm")}
    save_file({**tensors, **towers, **redundant}, tmp_path / "model.safetensors")
    text = json.loads((causal_dir / "config.json").read_text())
    config = {"architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n", "text_config": text,
              "vision_config": {"model_type": "gemma3n_vision"}, "audio_config": {"model_type": "gemma3n_audio"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg, weights = load_weights(tmp_path, np.float32, progress=False)
    causal_cfg, causal = load_weights(causal_dir, np.float32, progress=False)
    assert cfg == dataclasses.replace(causal_cfg, architecture="Gemma3nForConditionalGeneration")
    assert len(jax.tree.leaves(weights)) == len(jax.tree.leaves(causal))
    for ours, theirs in zip(jax.tree.leaves(weights), jax.tree.leaves(causal)):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


@pytest.mark.parametrize("setting, value", [
    ("attention_bias", True), ("hidden_size_per_layer_input", 0), ("altup_num_inputs", 1),
    ("altup_active_idx", 4), ("vocab_size_per_layer_input", 300), ("activation_sparsity_pattern", [1.0] * 4),
    ("activation_sparsity_pattern", [0.95] * 3), ("intermediate_size", [128] * 3), ("num_kv_shared_layers", 4),
])
def test_unsupported_settings_are_refused_by_name(setting, value):
    """Attention biases, no per-layer inputs, one AltUp stream or an active one past them, a per-layer table larger
    than the vocabulary, a sparsity of 1, per-layer lists of the wrong length, every layer sharing."""
    config_cls, extra = ARCH_CONFIGS["gemma3n"]
    hf = {**config_cls(**{**COMMON, **extra}).to_dict(), "architectures": ["Gemma3nForCausalLM"], setting: value}
    with pytest.raises(ConfigError, match=setting.replace("altup_active_idx", "altup_num_inputs")):
        from_hf_config(hf)


def test_fields_a_config_leaves_out_read_as_transformers_reads_them():
    """transformers' Gemma3nTextConfig defaults at 12 layers: every 5th global, the first 10 MLP gates sparse (0.95),
    the shared layers (4 here: the default 15 is more than 12) each reading the last earlier layer of its type."""
    given = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=12, num_attention_heads=4,
                 num_kv_shared_layers=4, vocab_size_per_layer_input=256)
    hf = transformers.Gemma3nTextConfig(**given)
    cfg = from_hf_config({**given, "architectures": ["Gemma3nForCausalLM"]})
    assert [w == 0 for w in cfg.layer_windows] == [t == "full_attention" for t in hf.layer_types]
    assert set(cfg.layer_windows) == {0, hf.sliding_window}
    assert list(cfg.layer_sparsity) == hf.activation_sparsity_pattern
    types = hf.layer_types  # (transformers 5.17 has no kv_sharing_modes to read the stores from)
    assert [cfg.kv_source(i) for i in range(8, 12)] == [max(j for j in range(8) if types[j] == types[i])
                                                        for i in range(8, 12)]
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.per_layer_input_size, cfg.final_soft_cap, cfg.rms_norm_eps,
            cfg.max_position_embeddings, cfg.tie_word_embeddings, cfg.activation) == (
        hf.head_dim, hf.num_key_value_heads, hf.hidden_size_per_layer_input, hf.final_logit_softcapping,
        hf.rms_norm_eps, hf.max_position_embeddings, hf.tie_word_embeddings, "gelu_tanh")
    assert (cfg.rope_theta, cfg.local_rope_theta) == (hf.rope_parameters["full_attention"]["rope_theta"],
                                                      hf.rope_parameters["sliding_attention"]["rope_theta"])
    assert cfg.gemma3n == Gemma3nFields(altup_inputs=hf.altup_num_inputs, altup_active=hf.altup_active_idx,
                                        altup_correct_scale=hf.altup_correct_scale, laurel_rank=hf.laurel_rank,
                                        per_layer_vocab=256)
