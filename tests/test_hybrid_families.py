"""Hybrid families with a recurrent state: dense Granite 4.0-H (`GraniteMoeHybridForCausalLM` with no routed
experts) and IBM Bamba (Mamba2 or attention, then a gated MLP: models/hybrid), Nemotron-H (one Mamba2, attention
or MLP mixer per layer) and Qwen3-Next (Gated DeltaNet or gated attention, then experts beside a gated shared
expert: models/qwen3_next), each against transformers on the same tiny saved weights: logits, and a chunked
engine run (Bamba's and Qwen3-Next's batched and preempted) giving each prompt transformers' greedy tokens for it
alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers

from jaxinfer import LLM, ConfigError, SamplingParams, from_hf_config
from jaxinfer.checkpoint.hf_names import in_mtp_layer

# Mamba2, attention, Mamba2 layers; the mixer's every axis > 1 (8 heads of 16 dims in 2 groups, 16 state dims).
MAMBA = dict(vocab_size=256, hidden_size=64, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16,
             mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, initializer_range=0.1, max_position_embeddings=512,
             bos_token_id=1, eos_token_id=2, pad_token_id=0)
# Granite 4.0-H-Micro's shape: no routed experts, the shared MLP alone; Granite's multipliers away from 1.
DENSE_GRANITE = dict(MAMBA, layer_types=["mamba", "attention", "mamba"], num_local_experts=0,
                     shared_intermediate_size=48, embedding_multiplier=2.0, residual_multiplier=0.5,
                     attention_multiplier=0.2, logits_scaling=0.5)
# Bamba's attention at layer 1, rotating half of each head (transformers' partial_rotary_factor for Bamba).
BAMBA = dict(MAMBA, attn_layer_indices=[1], rms_norm_eps=1e-5)
# Nemotron-H's pattern: Mamba2, attention (NoPE), ReLU^2 MLP layers; its own names for the mixer's dims.
NEMOTRON_H = dict(vocab_size=256, hidden_size=64, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, layers_block_type=["mamba", "attention", "mlp"], mamba_num_heads=8, mamba_head_dim=16,
                  n_groups=2, ssm_state_size=16, conv_kernel=4, expand=2, chunk_size=16, initializer_range=0.1,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
# Qwen3-Next: a Gated DeltaNet layer (2 q/k heads of 8 dims, each serving 2 of the 4 value heads of 16), then gated
# attention rotating a quarter of each 16-dim head; 2 of 4 experts beside a 48-wide shared expert in both.
QWEN3_NEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, layer_types=["linear_attention", "full_attention"],
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=16,
                  linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=48, initializer_range=0.1, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
PROMPT = np.random.RandomState(2).randint(3, 256, size=40).tolist()
# Bamba's and Qwen3-Next's runs batch 6 and 28 tokens, the longer prefilled over two steps, one preempted; dense
# Granite's (the same layer code) and Nemotron-H's (the state pool's handling is Bamba's) prefill the 28 over two
# steps alone: lighter runs, fewer step programs to compile.
FAMILIES = {
    "dense_granite_hybrid": (transformers.GraniteMoeHybridForCausalLM, transformers.GraniteMoeHybridConfig,
                             DENSE_GRANITE, [PROMPT[2:30]]),
    "bamba": (transformers.BambaForCausalLM, transformers.BambaConfig, BAMBA, [PROMPT[:6], PROMPT[2:30]]),
    "nemotron_h": (transformers.NemotronHForCausalLM, transformers.NemotronHConfig, NEMOTRON_H, [PROMPT[2:30]]),
    "qwen3_next": (transformers.Qwen3NextForCausalLM, transformers.Qwen3NextConfig, QWEN3_NEXT,
                   [PROMPT[:6], PROMPT[2:30]]),
}
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def hf_model(family) -> torch.nn.Module:
    """A random float32 model of the family (1-d parameters moved off their init values)."""
    model_class, config_class, config, _ = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(**config)).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(0.1 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def llm(hf_model, tmp_path_factory) -> LLM:
    """The model saved and loaded in float32: 16 tokens a step (the 28-token prompt prefills in two chunks) and 4
    pages of 16 for 2 requests of up to 22 and 44 tokens (one is preempted)."""
    path = tmp_path_factory.mktemp("hybrid")
    hf_model.save_pretrained(path)
    return LLM(str(path), dtype="float32", max_seq_len=64, max_num_seqs=2, max_num_batched_tokens=16, num_pages=5,
               cpu_kernels=False)


def hf_greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    """transformers' 16 greedy tokens for the prompt alone."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_logits_match_hf(hf_model, llm):
    with torch.no_grad():
        expected = hf_model(torch.tensor([PROMPT])).logits[0].numpy()
    got = llm.logits(PROMPT)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_chunked_and_preempted_engine_run_matches_each_prompt_alone_in_hf(family, hf_model, llm):
    """Each prompt gets transformers' greedy tokens for it alone (transformers' Mamba2 generate is its slow torch
    path: few prompts), the 28-token one prefilled over two steps; Bamba's batch preempts one and recomputes it from
    a fresh state."""
    prompts = FAMILIES[family][3]
    expected = [hf_greedy(hf_model, p) for p in prompts]
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == expected
    assert (llm.metrics()["num_preemptions"] > 0) == (len(prompts) > 1)
    assert llm.engine.config.enable_prefix_caching is False


def test_bamba_config_as_transformers_reads_it():
    """Half of each head rotates (transformers sets partial_rotary_factor 0.5 for Bamba, over a top-level value;
    the rope parameters' wins), the mixer's gated norm takes rms_norm_eps; attention indices past the layers are
    refused by name."""
    hf = {**BAMBA, "architectures": ["BambaForCausalLM"]}
    cfg = from_hf_config(hf)
    assert (cfg.rotary_dim, cfg.head_dim, cfg.state_space.layers, cfg.state_space.norm_eps) == (8, 16, (0, 2), 1e-5)
    assert from_hf_config({**hf, "partial_rotary_factor": 1.0}).rotary_dim == 8  # transformers overrides it
    rope = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0}
    assert from_hf_config({**hf, "rope_parameters": rope}).rotary_dim == 16
    with pytest.raises(ConfigError, match=r"attn_layer_indices \[3\] must index the 3 layers"):
        from_hf_config({**hf, "attn_layer_indices": [3]})


def test_nemotron_h_config_as_transformers_reads_it():
    """A released config's hybrid_override_pattern (M Mamba2, * attention, - MLP): no layer rotates, dt clamped
    to (time_step_min, inf) as transformers' mixer does; MoE layers ("E") refused by name."""
    hf = {**{k: v for k, v in NEMOTRON_H.items() if k != "layers_block_type"}, "hybrid_override_pattern": "M*-M",
          "architectures": ["NemotronHForCausalLM"], "time_step_min": 0.002}
    cfg = from_hf_config(hf)
    assert (cfg.state_space.layers, cfg.mlp_only_layers, cfg.nope_layers) == ((0, 3), (2,), (0, 1, 2, 3))
    assert cfg.state_space.time_step_limit == (0.002, math.inf) and cfg.activation == "relu2"
    assert cfg.state_space.chunk_size == 16  # the chunked SSD's chunk: a 16-token prefill step runs it
    with pytest.raises(ConfigError, match="MoE layers .* not supported for NemotronHForCausalLM"):
        from_hf_config({**hf, "hybrid_override_pattern": "M*E-"})


def test_qwen3_next_config_as_transformers_reads_it():
    """Without layer_types every full_attention_interval-th layer attends (transformers' default: 4); a quarter of
    each head rotates; the DeltaNet's state takes Mamba2's shapes (value heads, value dims, key dims, key heads; q, k
    and v's conv channels); the checkpoint's MTP module is not read; dense MLP layers, value heads not a multiple of
    the key heads and unknown layer types are refused by name."""
    hf = {**{k: v for k, v in QWEN3_NEXT.items() if k != "layer_types"}, "num_hidden_layers": 8,
          "architectures": ["Qwen3NextForCausalLM"]}
    cfg = from_hf_config(hf)
    ss = cfg.state_space
    assert (ss.layers, cfg.rotary_dim, cfg.norm_weight_offset) == ((0, 1, 2, 4, 5, 6), 4, 1.0)
    assert (ss.num_heads, ss.head_dim, ss.state_size, ss.n_groups, ss.conv_dim) == (4, 16, 8, 2, 96)
    assert in_mtp_layer(cfg, "mtp.layers.0.mlp.gate.weight") and not in_mtp_layer(cfg, "model.layers.0.mlp.gate.weight")
    with pytest.raises(ConfigError, match=r"dense MLP layers \[1\] \(mlp_only_layers \[1\].*Qwen3NextForCausalLM"):
        from_hf_config({**hf, "mlp_only_layers": [1]})
    with pytest.raises(ConfigError, match=r"linear_num_value_heads \(3\) must be a multiple of linear_num_key_heads"):
        from_hf_config({**hf, "linear_num_value_heads": 3})
    with pytest.raises(ConfigError, match=r"layer_types \['mamba'.* must list one of \['linear_attention'"):
        from_hf_config({**hf, "layer_types": ["mamba"] * 8})
