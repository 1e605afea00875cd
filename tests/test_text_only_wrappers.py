"""Multimodal checkpoints whose language model runs text-only, beyond test_hf_parity's float32 logits of each (Kimi
K2.5 as transformers saves Kimi_K25ForConditionalGeneration, Apertus 1.5's pruned head as Apertus1p5TextForCausalLM,
Gemma 4 Unified as Gemma4UnifiedForCausalLM, Cohere Compass as CohereCompassForCausalLM, EXAONE 4.5 as
Exaone4ForCausalLM, Step 3.7's, Muse Glimmer's and Muse Spark's wrapped models, MiniMax-M3 in MiniMax's layout as
MiniMaxM3VLForCausalLM): the layouts their makers ship, read to the same weights, their images, video and audio
refused by name, and Apertus 1.5's, Gemma 4 Unified's, Cohere Compass's, Step 3.7's, the Muse models' and
MiniMax-M3's settings refused by name. No step program is compiled."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
import torch
from hf_models import ARCH_CONFIGS, COMMON, hf, make_hf_model
from safetensors.numpy import load_file, save_file

from jaxinfer import LLM, SamplingParams
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.config.model import ConfigError
from jaxinfer.entrypoints.multimodal import load_vision
from jaxinfer.models.registry import from_hf_config

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


@pytest.fixture(scope="module")
def apertus1p5_wrapped(tmp_path_factory, checkpoint_dir):
    """Apertus1p5ForConditionalGeneration's layout: Apertus1p5TextForCausalLM's tensors under
    `model.language_model.*` (the head `lm_head.*`) beside the vision and audio tokenizers (skipped), the text
    config under text_config. transformers' model builds a WavTokenizer audio encoder and a VQ image encoder, so the
    checkpoint is the causal LM's tensors renamed as Swiss AI stores them."""
    path, causal_dir = tmp_path_factory.mktemp("apertus1p5_wrapped"), checkpoint_dir("apertus1p5")
    tensors = {name.replace("model.", "model.language_model.", 1): array
               for name, array in load_file(causal_dir / "model.safetensors").items()}
    tokenizers = {f"model.{part}.weight": np.zeros((2, 2), np.float32)
                  for part in ("vision_tokenizer.encoder.conv_in", "vision_tokenizer.quantize.embedding",
                               "audio_tokenizer.encoder.conv")}
    save_file({**tensors, **tokenizers}, path / "model.safetensors")
    text = json.loads((causal_dir / "config.json").read_text())
    config = {"architectures": ["Apertus1p5ForConditionalGeneration"], "model_type": "apertus1p5",
              "text_config": text, "vision_config": {"model_type": "apertus1p5_vision_tokenizer"},
              "audio_config": {"model_type": "wavtokenizer_encoder"}, "tie_word_embeddings": False}
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_apertus1p5_conditional_generation_reads_its_language_model(apertus1p5_wrapped, checkpoint_dir):
    """The same config and weights as the causal LM's: 256 ids run (the head's), the embedding's first 256 of its
    300 stored rows read."""
    cfg, weights = load_weights(apertus1p5_wrapped, np.float32, progress=False)
    causal_cfg, causal = load_weights(checkpoint_dir("apertus1p5"), np.float32, progress=False)
    assert cfg == dataclasses.replace(causal_cfg, architecture="Apertus1p5ForConditionalGeneration")
    assert (cfg.vocab_size, cfg.stored_vocab_size, weights.embed.shape) == (256, 300, (256, 64))
    stored = load_file(checkpoint_dir("apertus1p5") / "model.safetensors")["model.embed_tokens.weight"]
    np.testing.assert_array_equal(np.asarray(weights.embed), stored[:256])
    assert_same_weights(weights, causal)


def test_apertus1p5_images_audio_and_codes_are_refused(apertus1p5_wrapped):
    """Its tokenizers are not run: a prompt with an image or audio is refused, and one holding an id past the pruned
    head's (a visual or audio code written out) as outside the vocabulary."""
    llm = LLM(apertus1p5_wrapped, dtype="float32", max_seq_len=64)
    image, audio = np.zeros((32, 32, 3), np.uint8), (np.zeros(1600), 16_000)
    for kind, data, match in (("image", image, "takes no images"), ("audio", audio, "audio")):
        with pytest.raises(ValueError, match=match):
            llm.generate({"prompt_token_ids": PROMPT, "multi_modal_data": {kind: data}}, SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match=r"ids \[270\] outside the vocabulary \[0, 256\)"):
        llm.generate({"prompt_token_ids": PROMPT + [270]}, SamplingParams(max_tokens=1))


@pytest.mark.parametrize("setting, match", [
    (dict(output_vocab_size=301), "output_vocab_size 301 is not supported"),
    (dict(output_vocab_size=0), "output_vocab_size 0 is not supported"),
    (dict(tie_word_embeddings=True), "output_vocab_size 256 with tie_word_embeddings=True"),
])
def test_apertus1p5_head_settings_refused_by_name(setting, match):
    """A pruned head wider than the vocabulary or empty, or tied to the embedding it no longer matches."""
    extra = ARCH_CONFIGS["apertus1p5"][1]
    hf_config = {**COMMON, **extra, "architectures": ["Apertus1p5TextForCausalLM"], **setting}
    with pytest.raises(ConfigError, match=match):
        from_hf_config(hf_config)
    assert from_hf_config({**hf_config, **setting, "output_vocab_size": 300}).vocab_size == 300


@pytest.fixture(scope="module")
def gemma4_unified_wrapped(tmp_path_factory, checkpoint_dir):
    """Gemma4UnifiedForConditionalGeneration as transformers saves it: the causal LM's language model under
    `model.language_model.*` beside its encoder-free image and audio embedders (`model.vision_embedder.*`,
    `model.embed_vision.*`, `model.embed_audio.*`), the text config under text_config."""
    path = tmp_path_factory.mktemp("gemma4_unified_wrapped")
    causal = make_hf_model("gemma4_unified")
    vision = hf.Gemma4UnifiedVisionConfig(patch_size=2, pooling_kernel_size=2, mm_embed_dim=16, mm_posemb_size=8)
    config = hf.Gemma4UnifiedConfig(text_config=causal.config.to_dict(), vision_config=vision,
                                    audio_config=hf.Gemma4UnifiedAudioConfig(audio_embed_dim=16))
    torch.manual_seed(0)
    model = hf.Gemma4UnifiedForConditionalGeneration(config)
    model.model.language_model.load_state_dict(causal.model.state_dict())
    model.save_pretrained(path)
    return path


def test_gemma4_unified_conditional_generation_reads_its_language_model(gemma4_unified_wrapped, checkpoint_dir):
    """The same config and weights as Gemma4UnifiedForCausalLM's checkpoint (whose logits test_hf_parity checks);
    the embedders are skipped."""
    cfg, weights = load_weights(gemma4_unified_wrapped, np.float32, progress=False)
    causal_cfg, causal = load_weights(checkpoint_dir("gemma4_unified"), np.float32, progress=False)
    assert cfg == dataclasses.replace(causal_cfg, architecture="Gemma4UnifiedForConditionalGeneration")
    assert (cfg.per_layer_input_size, cfg.num_experts, cfg.kv_sources) == (0, 0, (0, 1, 0, 1))
    assert_same_weights(weights, causal)


def test_gemma4_unified_images_and_audio_are_refused(gemma4_unified_wrapped):
    """Its embedders are not run: a prompt with an image or audio is refused before it is scheduled."""
    llm = LLM(gemma4_unified_wrapped, dtype="float32", max_seq_len=64)
    image, audio = np.zeros((32, 32, 3), np.uint8), (np.zeros(1600), 16_000)
    for kind, data, match in (("image", image, "takes no images"), ("audio", audio, "audio")):
        with pytest.raises(ValueError, match=match):
            llm.generate({"prompt_token_ids": PROMPT, "multi_modal_data": {kind: data}}, SamplingParams(max_tokens=1))


def test_gemma4_unified_bidirectional_attention_refused_by_name():
    """use_bidirectional_attention 'all' (every token seeing every other) is refused, as for Gemma 4."""
    hf_config = {**make_hf_model("gemma4_unified").config.to_dict(), "architectures": ["Gemma4UnifiedForCausalLM"],
                 "use_bidirectional_attention": "all"}
    with pytest.raises(ConfigError, match="use_bidirectional_attention='all' is not supported"):
        from_hf_config(hf_config)


@pytest.fixture(scope="module")
def cohere_compass_wrapped(tmp_path_factory):
    """CohereCompassForConditionalGeneration as transformers saves it (Qwen3-VL's layout): the causal LM's language
    model under `model.language_model.*`, its head `lm_head.*`, beside a one-block tower (`model.visual.*`)."""
    path = tmp_path_factory.mktemp("cohere_compass_wrapped")
    causal = make_hf_model("cohere_compass")
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, out_hidden_size=64,
                  num_position_embeddings=16, deepstack_visual_indexes=[])
    config = hf.CohereCompassConfig(text_config=causal.config.to_dict(), vision_config=vision)
    torch.manual_seed(0)
    model = hf.CohereCompassForConditionalGeneration(config)
    model.model.language_model.load_state_dict(causal.model.state_dict())
    model.lm_head.load_state_dict(causal.lm_head.state_dict())
    model.save_pretrained(path)
    return path


def test_cohere_compass_conditional_generation_reads_its_language_model(cohere_compass_wrapped, checkpoint_dir):
    """The same config and weights as CohereCompassForCausalLM's checkpoint (whose logits test_hf_parity checks), the
    head untied as the outer config says; the tower is skipped and not loaded, so an image is refused by name as
    test_gemma4_unified_images_and_audio_are_refused sees it refused."""
    cfg, weights = load_weights(cohere_compass_wrapped, np.float32, progress=False)
    causal_cfg, causal = load_weights(checkpoint_dir("cohere_compass"), np.float32, progress=False)
    assert cfg == dataclasses.replace(causal_cfg, architecture="CohereCompassForConditionalGeneration",
                                      tie_word_embeddings=False)
    assert (cfg.layer_windows, cfg.local_rope_theta, cfg.rope_theta) == ((8, 0), 1e4, 5e5)
    assert_same_weights(weights.layers, causal.layers)
    assert load_vision(cohere_compass_wrapped, np.float32) is None  # no tower runs: LLM refuses images by name


@pytest.mark.parametrize("rope, match", [
    ({"rope_type": "default", "rope_theta": 1e4}, "one entry per layer type"),
    ({"sliding_attention": {"rope_type": "yarn", "factor": 2.0}, "full_attention": None},
     r"rope_parameters\['sliding_attention'\] .* accepted is the default rope"),
])
def test_cohere_compass_rope_settings_refused_by_name(rope, match):
    """A rope not keyed by layer type (transformers' rotary reads one entry per type) or a scaled one."""
    hf_config = {**make_hf_model("cohere_compass").config.to_dict(), "architectures": ["CohereCompassForCausalLM"],
                 "rope_parameters": rope}
    with pytest.raises(ConfigError, match=match):
        from_hf_config(hf_config)


@pytest.fixture(scope="module")
def exaone4_5_wrapped(tmp_path_factory):
    """Exaone4_5_ForConditionalGeneration as transformers saves it (Qwen2-VL's layout): EXAONE 4.0's language model
    (test_hf_parity's exaone4 weights) under `model.language_model.*`, its head `lm_head.*`, beside a one-block tower
    (`model.visual.*`); the text config's model_type exaone4."""
    path = tmp_path_factory.mktemp("exaone4_5_wrapped")
    causal = make_hf_model("exaone4")
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, num_key_value_heads=1, patch_size=4,
                  out_hidden_size=64, window_size=8, fullatt_block_indexes=[0])
    config = hf.Exaone4_5_Config(text_config=causal.config.to_dict(), vision_config=vision)
    torch.manual_seed(0)
    model = hf.Exaone4_5_ForConditionalGeneration(config)
    model.model.language_model.load_state_dict(causal.model.state_dict())
    model.lm_head.load_state_dict(causal.lm_head.state_dict())
    model.save_pretrained(path)
    return path


def test_exaone4_5_conditional_generation_reads_its_language_model(exaone4_5_wrapped, checkpoint_dir):
    """The same config and weights as Exaone4ForCausalLM's checkpoint (whose logits test_hf_parity checks; HF's
    wrapped model gives its logits exactly, checked once by hand); the tower is skipped and not loaded, so an image is
    refused by name as test_gemma4_unified_images_and_audio_are_refused sees it refused."""
    cfg, weights = load_weights(exaone4_5_wrapped, np.float32, progress=False)
    causal_cfg, causal = load_weights(checkpoint_dir("exaone4"), np.float32, progress=False)
    assert cfg == dataclasses.replace(causal_cfg, architecture="Exaone4_5_ForConditionalGeneration")
    assert (cfg.layer_windows, cfg.nope_layers) == ((8, 0), (1,))
    assert_same_weights(weights, causal)
    assert load_vision(exaone4_5_wrapped, np.float32) is None


def test_step3p7_tower_is_not_loaded(checkpoint_dir):
    """Step3p7ForConditionalGeneration (whose language model's float32 logits test_hf_parity checks) runs text only:
    its tower (`vision_model.*`) and projector are skipped, so an image is refused by name."""
    assert load_vision(checkpoint_dir("step3p7"), np.float32) is None


@pytest.mark.parametrize("setting, match", [
    ({"num_sliding_attention_heads": 8}, "num_sliding_attention_heads 8 is not supported"),
    ({"attention_other_setting": {"num_attention_heads": 8}}, "attention_other_setting .* the hub's own config"),
    ({"gating": "per-element"}, "gating 'per-element' is not supported"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention True is not supported"),
    ({"layer_types": ["minimax_m3_sparse", "full_attention"]}, "layer_types .* are not supported"),
    ({"swiglu_limits": [7.0]}, r"swiglu_limits \[7.0\] is not supported"),
])
def test_step3p7_settings_refused_by_name(checkpoint_dir, setting, match):
    """Sliding layers with their own head count, per-element gates, bidirectional attention, MiniMax-M3's sparse
    layers, the hub's pre-transformers fields and a clamp list of the wrong length are refused by name."""
    hf_config = json.loads((checkpoint_dir("step3p7") / "config.json").read_text())
    hf_config["text_config"].update(setting)
    with pytest.raises(ConfigError, match=match):
        from_hf_config(hf_config)


def test_muse_glimmer_tower_is_not_loaded(checkpoint_dir):
    """MuseGlimmerForConditionalGeneration (whose language model's float32 logits test_hf_parity checks) runs text
    only: its tower, adapter and projection are skipped, so an image is refused by name."""
    assert load_vision(checkpoint_dir("muse_glimmer"), np.float32) is None


@pytest.mark.parametrize("setting, match", [
    ({"layer_rope_theta": [10000.0, 5e5]}, r"layer_rope_theta \[10000.0, 500000.0\] is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "the default rope only"),
])
def test_muse_glimmer_settings_refused_by_name(checkpoint_dir, setting, match):
    """Per-layer thetas other than 0 (NoPE) or the global one, and a scaled rope, are refused by name."""
    hf_config = json.loads((checkpoint_dir("muse_glimmer") / "config.json").read_text())
    hf_config["text_config"].update(setting)
    with pytest.raises(ConfigError, match=match):
        from_hf_config(hf_config)


@pytest.fixture(scope="module")
def minimax_m3_wrapped(tmp_path_factory):
    """MiniMaxM3SparseForConditionalGeneration as transformers saves it (Llama 4's layout): the causal LM under
    `language_model.*` beside a one-layer tower, its projector and patch merger."""
    path = tmp_path_factory.mktemp("minimax_m3_wrapped")
    causal = make_hf_model("minimax_m3")
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    config = hf.MiniMaxM3VLConfig(text_config=causal.config.to_dict(), vision_config=vision, projector_hidden_size=64)
    torch.manual_seed(0)
    model = hf.MiniMaxM3SparseForConditionalGeneration(config)
    model.model.language_model.load_state_dict(causal.model.state_dict())
    model.lm_head.load_state_dict(causal.lm_head.state_dict())
    model.save_pretrained(path)
    return path


def test_minimax_m3_conditional_generation_reads_its_language_model(minimax_m3_wrapped, checkpoint_dir):
    """The same config and layer weights as MiniMaxM3VLForCausalLM's checkpoint (whose logits test_hf_parity checks);
    the tower is skipped and not loaded, so an image is refused by name."""
    cfg, weights = load_weights(minimax_m3_wrapped, np.float32, progress=False)
    causal_cfg, causal = load_weights(checkpoint_dir("minimax_m3"), np.float32, progress=False)
    assert cfg == dataclasses.replace(causal_cfg, architecture="MiniMaxM3SparseForConditionalGeneration")
    assert (cfg.block_indexer.layers, cfg.dense_layers, cfg.rotary_dim) == ((0,), (0,), 8)
    assert_same_weights(weights.layers, causal.layers)
    assert_same_weights(weights.lm_head, causal.lm_head)
    assert load_vision(minimax_m3_wrapped, np.float32) is None  # no tower runs: LLM refuses images by name


@pytest.mark.parametrize("change, match", [
    (dict(index_n_heads=1), "index_n_heads 1 is not supported: it must equal num_key_value_heads 2"),
    (dict(rotary_dim=16), "rotary_dim 16 is not supported where transformers turns 8"),
    (dict(layer_types=["minimax_m3_sparse", "sliding_attention"]), "layer_types .* is not supported"),
    (dict(index_local_blocks=3), "index_local_blocks 3 are not supported"),
])
def test_minimax_m3_settings_refused_by_name(change, match):
    """An index head per K/V head, transformers' rotated dims, its two attention kinds, local blocks within top-k."""
    config = hf.MiniMaxM3VLTextConfig(**{**COMMON, **ARCH_CONFIGS["minimax_m3"][1]}).to_dict()
    with pytest.raises(ConfigError, match=match):
        from_hf_config({**config, **change, "architectures": ["MiniMaxM3VLForCausalLM"]})
def test_muse_spark_towers_are_not_loaded(checkpoint_dir):
    """MuseSparkForConditionalGeneration (whose language model's float32 logits test_hf_parity checks) runs text
    only: its vision and audio towers are skipped, so an image is refused by name."""
    assert load_vision(checkpoint_dir("muse_spark"), np.float32) is None


@pytest.mark.parametrize("setting, match", [
    ({"mlp_layer_types": ["sparse"]}, r"mlp_layer_types \['sparse'\] is not supported"),
    ({"residual_gate_temperature": 0.0}, "residual_gate_temperature 0.0 is not supported"),
    ({"layer_rope_theta": [0, 5e5]}, r"layer_rope_theta \[0, 500000.0\] is not supported"),
])
def test_muse_spark_settings_refused_by_name(checkpoint_dir, setting, match):
    """An MLP type list of the wrong length, a residual gate temperature <= 0 and per-layer thetas other than 0 or the
    global one are refused by name."""
    hf_config = json.loads((checkpoint_dir("muse_spark") / "config.json").read_text())
    hf_config["text_config"].update(setting)
    with pytest.raises(ConfigError, match=match):
        from_hf_config(hf_config)
