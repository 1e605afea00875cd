"""Qwen3.5 (models/qwen3_5) against transformers on the same tiny saved weights: the dense `Qwen3_5ForCausalLM`'s
logits and greedy choices; Qwen3.5-MoE
as Qwen ships it (`Qwen3_5MoeForConditionalGeneration`: nested text config, the language model under
`model.language_model.`, fused experts, a vision tower skipped at load) to transformers' logits; and how the configs
and tensor names are read."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers
from test_hybrid_families import PROMPT, QWEN3_NEXT

from jaxinfer import LLM, from_hf_config
from jaxinfer.checkpoint.hf_names import expected_hf_names
from jaxinfer.checkpoint.loader import layer_fields
from jaxinfer.models.decoder import abstract_weights

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


def test_moe_conditional_generation_checkpoint_as_the_hub_holds_it(tmp_path, caplog):
    """The checkpoint written from the model's own state dict, as Qwen's are (each layer's experts in two fused
    tensors; transformers' save_pretrained would split them per expert): its vision tower skipped with one log line,
    the language model's logits transformers' on text alone."""
    torch.manual_seed(0)
    config = transformers.Qwen3_5MoeConfig(text_config=MOE, vision_config=VISION)
    hf = perturbed(transformers.Qwen3_5MoeForConditionalGeneration(config))
    config.architectures = ["Qwen3_5MoeForConditionalGeneration"]
    config.save_pretrained(tmp_path)
    state = {name: tensor.contiguous() for name, tensor in hf.state_dict().items()}
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in state
    safetensors.torch.save_file(state, tmp_path / "model.safetensors")
    with caplog.at_level(logging.INFO, logger="jaxinfer.models.text_part"):
        llm = LLM(str(tmp_path), dtype="float32", max_seq_len=64, cpu_kernels=False)
    skipped = [r.getMessage() for r in caplog.records if "vision tower" in r.getMessage()]
    visual = sum(name.startswith("model.visual.") for name in state)
    assert skipped == [f"Qwen3_5MoeForConditionalGeneration: {visual} vision tower and projector tensors skipped; "
                       "the language model runs alone (text in, text out: images are not supported)"]
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor([PROMPT])).logits[0].numpy()
    got = llm.logits(PROMPT)
    assert max_error(got, expected) <= 1e-5
    assert (got.argmax(-1) == expected.argmax(-1)).all()


def test_configs_as_transformers_reads_them():
    """A conditional-generation config reads its text_config (the head tied by the outer flag, as transformers ties
    it); the M-RoPE sections leave a text model's plain partial rotary; the MoE router always renormalises, its
    experts are one tensor per expert as transformers saves Qwen3_5MoeForCausalLM, two fused in the hub's
    conditional-generation checkpoints; the DeltaNet's four projections are read apart."""
    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
            "mrope_interleaved": True}
    hf = {"architectures": ["Qwen3_5ForConditionalGeneration"], "tie_word_embeddings": True,
          "text_config": {**DENSE, "rope_parameters": rope}, "vision_config": VISION}
    cfg = from_hf_config(hf)
    assert (cfg.architecture, cfg.tie_word_embeddings, cfg.rotary_dim, cfg.rope_theta) == (
        "Qwen3_5ForConditionalGeneration", True, 4, 1e7)
    assert (cfg.state_space.layers, cfg.norm_weight_offset, cfg.intermediate_size) == ((0,), 1.0, 48)
    names = expected_hf_names(cfg, layer_fields(abstract_weights(cfg)))
    split = {f"model.layers.0.linear_attn.in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")}
    assert split <= names and "model.layers.1.mlp.gate_proj.weight" in names
    moe = from_hf_config({**MOE, "architectures": ["Qwen3_5MoeForCausalLM"], "norm_topk_prob": False})
    assert (moe.norm_topk_prob, moe.num_experts, moe.moe_intermediate_size, moe.intermediate_size) == (True, 4, 32, 32)
    per_expert = expected_hf_names(moe, layer_fields(abstract_weights(moe)))
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in per_expert
    hub = from_hf_config({"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": MOE})
    fused = expected_hf_names(hub, layer_fields(abstract_weights(hub)))
    assert {n for n in fused if re.search(r"experts\.(gate_up|down)_proj$", n)} == {
        f"model.layers.{i}.mlp.experts.{p}_proj" for i in (0, 1) for p in ("gate_up", "down")}

