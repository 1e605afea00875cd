"""Qwen3.5 (models/qwen3_5) against transformers on the same tiny saved weights: the dense `Qwen3_5ForCausalLM`'s
logits and greedy choices; `Qwen3_5ForConditionalGeneration` with an image (the tower's rows, the image's 3-D M-RoPE
positions over the partial rotary, every position's logits, an engine run); Qwen3.5-MoE as Qwen ships it
(`Qwen3_5MoeForConditionalGeneration`: nested text config, the language model under `model.language_model.`, fused
experts, its vision tower beside) to transformers' logits, and as transformers saves it (one tensor per expert); and
how the configs and tensor names are read."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers
from qwen2_vl_models import CLASSES, save_tiny_qwen2_vl
from test_hybrid_families import PROMPT, QWEN3_NEXT
from test_qwen2_vl import IMAGE_PROMPT, KNOBS, TEXT, hf_image_rows, hf_inputs, picture

from jaxinfer import LLM, ConfigError, SamplingParams, from_hf_config
from jaxinfer.checkpoint.hf_names import expected_hf_names
from jaxinfer.checkpoint.loader import layer_fields, load_hf_weights
from jaxinfer.models.decoder import abstract_weights
from jaxinfer.runtime.mrope_positions import offsets, total_delta
from jaxinfer.runtime.prompt_logprobs import all_position_logits

# Qwen3-Next's shapes (a DeltaNet layer, then gated attention rotating a quarter of each 16-dim head), its DeltaNet's
# projections stored apart; a 48-wide dense MLP in both layers, or 2 of 4 experts beside a 48-wide shared expert.
MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
DENSE = {k: v for k, v in QWEN3_NEXT.items() if k not in MOE_KEYS}
MOE = {k: v for k, v in QWEN3_NEXT.items() if k != "intermediate_size"}  # the MoE text config has none
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, out_hidden_size=64,
              num_position_embeddings=16)


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in eval mode with its 1-d parameters (norms, dt_bias, A_log) moved off their init values."""
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def max_error(got: np.ndarray, expected: np.ndarray) -> float:
    """max |got - expected| relative to max |expected|."""
    return float(np.abs(got - expected).max() / np.abs(expected).max())


@pytest.fixture(scope="module")
def dense_hf() -> torch.nn.Module:
    torch.manual_seed(0)
    return perturbed(transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**DENSE)))


@pytest.fixture(scope="module")
def dense_llm(dense_hf, tmp_path_factory) -> LLM:
    """Saved by transformers, loaded in float32."""
    path = tmp_path_factory.mktemp("qwen3_5")
    dense_hf.save_pretrained(path)
    return LLM(str(path), dtype="float32", max_seq_len=64, cpu_kernels=False)


def test_dense_logits_match_hf(dense_hf, dense_llm):
    """Float32 rounding only, and transformers' greedy choice after every prefix of the prompt. (The engine's
    chunked, batched and preempted runs go through the same hybrid layer and state pool as Qwen3-Next's, which
    tests/test_hybrid_families.py runs against transformers' greedy tokens; one more such run costs 13 s from an
    empty compilation cache.)"""
    with torch.no_grad():
        expected = dense_hf(torch.tensor([PROMPT])).logits[0].numpy()
    got = dense_llm.logits(PROMPT)
    assert max_error(got, expected) <= 1e-5
    assert (got.argmax(-1) == expected.argmax(-1)).all()


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    """A Qwen3_5ForConditionalGeneration saved by transformers: Qwen3-VL's tower without DeepStack over the hybrid
    language model, its M-RoPE sections (2, 3, 3) over half of each 32-dim head."""
    return save_tiny_qwen2_vl(tmp_path_factory.mktemp("qwen3_5_vl"), "qwen3_5")


@pytest.fixture(scope="module")
def vl_hf(vl_dir):
    return CLASSES["qwen3_5"][1].from_pretrained(vl_dir).eval()


@pytest.fixture(scope="module")
def vl_llm(vl_dir):
    """The prompt with an image (25 tokens) in one step: one ragged step program beside the decode step's."""
    return LLM(vl_dir, **{**KNOBS, "max_num_batched_tokens": 32, "max_num_seqs": 1})


def test_image_rows_positions_and_logits_match_hf(vl_llm, vl_hf):
    """The tower's rows (no DeepStack rows beside), the image's 3-D positions and every position's float32 logits of
    a prompt with text after the image, through the all-positions pass (without the positions they are not HF's); a
    text prompt's through the same program."""
    inputs = hf_inputs(vl_llm, [picture(0)])
    ids = inputs["input_ids"][0].numpy()
    (image,) = vl_llm.image_prompts.prompt(IMAGE_PROMPT, [picture(0)], "test")[1]
    text = vl_llm.tokenizer.encode(TEXT)
    with torch.no_grad():
        expected = vl_hf(**inputs).logits[0].numpy()
        expected_text = vl_hf(input_ids=torch.tensor([text])).logits[0].numpy()
        hf_positions, hf_delta = vl_hf.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                            inputs["image_grid_thw"])
    hf_rows = hf_image_rows(vl_hf, inputs)
    rows = vl_llm.engine.runner.vision.features(image)
    assert rows.shape == hf_rows.shape == (15, vl_llm.config.hidden_size)
    assert max_error(rows, hf_rows) <= 1e-5
    positions = np.arange(len(ids))
    rope_offsets = offsets((image,), positions)
    assert np.array_equal(positions + rope_offsets.T, hf_positions[:, 0].numpy())
    assert total_delta((image,)) == hf_delta.item()
    placed = np.zeros((len(ids), rows.shape[1]), np.float32)
    placed[image.offset : image.offset + image.length] = rows

    def logits(tokens: list[int], rows: np.ndarray, rope: np.ndarray) -> np.ndarray:
        mask = np.asarray(tokens) == vl_llm.image_prompts.cfg.image_token_id
        return all_position_logits(vl_llm.weights, vl_llm.config, tokens, vl_llm.dtype, vl_llm.max_seq_len,
                                   rows=(rows, mask, rope))

    assert max_error(logits(ids.tolist(), placed, rope_offsets), expected) <= 1e-5
    assert max_error(logits(ids.tolist(), placed, 0 * rope_offsets), expected) > 1e-2
    no_rows = np.zeros((len(text), rows.shape[1]), np.float32)
    got_text = logits(text, no_rows, np.zeros((len(text), 3), np.int64))
    assert max_error(got_text, expected_text) <= 1e-5
    assert (got_text.argmax(-1) == expected_text.argmax(-1)).all()


def test_engine_greedy_with_an_image_matches_hf(vl_llm, vl_hf):
    """Eight greedy tokens of the image prompt through the engine (prefilled in one 32-token step, decode rotated by
    the image's delta) as transformers' generate gives them: Qwen3.5's one engine run in the suite (6.6 s from an
    empty compilation cache; 16-token chunks and a batched text prompt cost 13.6 s)."""
    (out,) = vl_llm.generate({"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": picture(0)}},
                             SamplingParams(max_tokens=8, temperature=0))
    inputs = hf_inputs(vl_llm, [picture(0)])
    with torch.no_grad():
        hf = vl_hf.generate(**inputs, max_new_tokens=8, do_sample=False)[0, inputs["input_ids"].shape[1]:]
    assert out.outputs[0].token_ids == hf.tolist()


@pytest.fixture(scope="module")
def moe_hf() -> torch.nn.Module:
    torch.manual_seed(0)
    rope = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0]}
    config = transformers.Qwen3_5MoeConfig(text_config={**MOE, "rope_parameters": rope}, vision_config=VISION)
    return perturbed(transformers.Qwen3_5MoeForConditionalGeneration(config))


def test_moe_conditional_generation_checkpoint_as_the_hub_holds_it(moe_hf, tmp_path, caplog):
    """The checkpoint written from the model's own state dict, as Qwen's are (each layer's experts in two fused
    tensors): its vision tower loaded (no DeepStack), nothing skipped; the language model's logits transformers' on
    text alone."""
    config = moe_hf.config
    config.architectures = ["Qwen3_5MoeForConditionalGeneration"]
    config.save_pretrained(tmp_path)
    state = {name: tensor.contiguous() for name, tensor in moe_hf.state_dict().items()}
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in state
    safetensors.torch.save_file(state, tmp_path / "model.safetensors")
    with caplog.at_level(logging.INFO, logger="jaxinfer.models.text_part"):
        llm = LLM(str(tmp_path), dtype="float32", max_seq_len=64, cpu_kernels=False)
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]
    assert llm.image_prompts.cfg.deepstack_layers == 0 and llm.config.mrope_interleaved
    with torch.no_grad():
        expected = moe_hf(input_ids=torch.tensor([PROMPT])).logits[0].numpy()
    got = llm.logits(PROMPT)
    assert max_error(got, expected) <= 1e-5
    assert (got.argmax(-1) == expected.argmax(-1)).all()


def test_moe_conditional_generation_saved_per_expert(moe_hf, tmp_path):
    """transformers' save_pretrained writes the experts one tensor per expert: they load as the fused ones do."""
    moe_hf.save_pretrained(tmp_path)
    index = safetensors.torch.load_file(tmp_path / "model.safetensors")
    assert "model.language_model.layers.0.mlp.experts.3.gate_proj.weight" in index
    cfg = from_hf_config(moe_hf.config.to_dict())
    layer = load_hf_weights(tmp_path, cfg, np.float32, progress=False).layers[0]
    experts = moe_hf.model.language_model.layers[0].mlp.experts
    gate_up = experts.gate_up_proj.detach().numpy()  # [E, 2F, D]: gate rows, then up
    F = gate_up.shape[1] // 2
    np.testing.assert_array_equal(np.asarray(layer.moe_gate), gate_up[:, :F].transpose(0, 2, 1))
    np.testing.assert_array_equal(np.asarray(layer.moe_up), gate_up[:, F:].transpose(0, 2, 1))
    np.testing.assert_array_equal(np.asarray(layer.moe_down), experts.down_proj.detach().numpy().transpose(0, 2, 1))


def test_configs_as_transformers_reads_them():
    """A conditional-generation config reads its text_config (the head tied by the outer flag, as transformers ties
    it) as Qwen3_5ForCausalLM's with the M-RoPE sections interleaved over the partial rotary (sections adding up to
    the whole head's frequencies are refused); the MoE router always renormalises, its experts are one tensor per
    expert as transformers saves them, two fused in the hub's conditional-generation checkpoints (the loader reads
    whichever is stored); the DeltaNet's four projections are read apart."""
    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
            "mrope_interleaved": True}
    hf = {"architectures": ["Qwen3_5ForConditionalGeneration"], "tie_word_embeddings": True,
          "text_config": {**DENSE, "rope_parameters": rope}, "vision_config": VISION}
    cfg = from_hf_config(hf)
    assert (cfg.architecture, cfg.tie_word_embeddings, cfg.rotary_dim, cfg.rope_theta) == (
        "Qwen3_5ForCausalLM", True, 4, 1e7)
    assert (cfg.mrope_section, cfg.mrope_interleaved) == ((1, 1, 0), True)
    whole_head = {**hf, "text_config": {**DENSE, "rope_parameters": {**rope, "mrope_section": [2, 3, 3]}}}
    with pytest.raises(ConfigError, match=r"mrope_section \[2, 3, 3\] must add up to the 2 rotary frequencies"):
        from_hf_config(whole_head)
    assert (cfg.state_space.layers, cfg.norm_weight_offset, cfg.intermediate_size) == ((0,), 1.0, 48)
    names = expected_hf_names(cfg, layer_fields(abstract_weights(cfg)))
    split = {f"model.layers.0.linear_attn.in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")}
    assert split <= names and "model.layers.1.mlp.gate_proj.weight" in names
    moe = from_hf_config({**MOE, "architectures": ["Qwen3_5MoeForCausalLM"], "norm_topk_prob": False})
    assert (moe.norm_topk_prob, moe.num_experts, moe.moe_intermediate_size, moe.intermediate_size) == (True, 4, 32, 32)
    per_expert = expected_hf_names(moe, layer_fields(abstract_weights(moe)))
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in per_expert
    hub = from_hf_config({"architectures": ["Qwen3_5MoeForConditionalGeneration"],
                          "text_config": {**MOE, "rope_parameters": rope}})
    fused = expected_hf_names(hub, layer_fields(abstract_weights(hub)))
    assert {n for n in fused if re.search(r"experts\.(gate_up|down)_proj$", n)} == {
        f"model.layers.{i}.mlp.experts.{p}_proj" for i in (0, 1) for p in ("gate_up", "down")}

