"""Hybrid families with a recurrent state: dense Granite 4.0-H (`GraniteMoeHybridForCausalLM` with no routed
experts) and IBM Bamba (Mamba2 or attention, then a gated MLP: models/hybrid), Nemotron-H (one Mamba2, attention
or MLP mixer per layer) and Qwen3-Next (Gated DeltaNet or gated attention, then experts beside a gated shared
expert: models/qwen3_next), each against transformers on the same tiny saved weights: logits, and a chunked
engine run (Bamba's and Qwen3-Next's batched and preempted) giving each prompt transformers' greedy tokens for it
alone. Falcon-H1 (attention and Mamba2 side by side in every layer, muP multipliers), LFM2 (gated short
convs or attention) and LFM2-MoE (those mixers before routed experts) run the same checks, Falcon-H1's
batched and preempted; LFM2's and LFM2-MoE's prefill the 28 over two steps alone
(its short conv's fresh and continued slot states: tests/test_ssd_chunks.py), as do MiniMax-Text-01's (lightning
attention's decayed linear attention beside Mixtral's attention and experts: models/minimax)."""

from __future__ import annotations

import copy
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hf_models import hf
from hf_versions import skip_layer_counted_blocks, skip_ungrouped_gated_norm
from safetensors import safe_open

from jaxinfer import LLM, ConfigError, SamplingParams, SpeculativeConfig, from_hf_config
from jaxinfer.cache.paged import page_bytes
from jaxinfer.checkpoint.converted import quantization_of
from jaxinfer.checkpoint.hf_names import in_mtp_layer
from jaxinfer.checkpoint.loader import IGNORED_SUFFIXES
from jaxinfer.config.minimax import decay_rates
from jaxinfer.config.state_space import StateSpace
from jaxinfer.entrypoints.state_settings import check_speculation, prefix_caching_setting
from jaxinfer.models.decoder import abstract_weights
from jaxinfer.models.kimi_delta import forget_gate
from jaxinfer.models.kimi_linear import stored_names
from jaxinfer.models.mamba2_mixer import gated_output
from jaxinfer.models.weight_ops import quantize_weights
from jaxinfer.parallel.array_info import is_info
from jaxinfer.quantization.quantized_weight import QuantizedWeight

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
# Falcon-H1: attention and a Mamba2 mixer (6 heads of 16 in 2 groups: mamba_d_ssm 96, not mamba_expand x 64) in each
# of 2 layers; every muP multiplier away from 1; no gated norm (FalconH1Config's default; the norms: see below).
FALCON_H1 = dict(vocab_size=256, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, mamba_d_ssm=96, mamba_n_heads=6, mamba_d_head=16, mamba_n_groups=2,
                 mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16, embedding_multiplier=2.0,
                 lm_head_multiplier=0.5, key_multiplier=0.7, attention_in_multiplier=0.8, attention_out_multiplier=1.3,
                 ssm_in_multiplier=1.2, ssm_out_multiplier=0.6, mlp_multipliers=[1.5, 0.7],
                 ssm_multipliers=[0.9, 1.1, 1.2, 0.8, 1.3], initializer_range=0.1, max_position_embeddings=512,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0)
# LFM2: a short conv (3 taps, biased) then attention (q/k norms); the MLP sized as transformers adjusts it: 2/3 of
# 96, times 1.5, rounded up to a multiple of 16.
LFM2 = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, layer_types=["conv", "full_attention"], conv_L_cache=3, conv_bias=True,
            block_multiple_of=16, block_ffn_dim_multiplier=1.5, initializer_range=0.1, max_position_embeddings=512,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)
# LFM2-MoE: a dense conv layer (num_dense_layers 1), then attention and a conv each before 2 of 4 sigmoid-routed
# experts (the expert_bias moved off zero below, the weights scaled by 1.5).
LFM2_MOE = dict(vocab_size=256, hidden_size=64, intermediate_size=48, moe_intermediate_size=32, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention", "conv"],
                conv_L_cache=3, num_experts=4, num_experts_per_tok=2, num_dense_layers=1, routed_scaling_factor=1.5,
                initializer_range=0.1, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# Kimi Linear: KDA (4 heads of 16), NoPE latent attention (32-value latent, 16 + 16 query/key dims, 24 value dims),
# KDA, by the hub's 1-indexed linear_attn_config; layer 0's MLP dense, then 2 of 4 sigmoid-routed experts (their
# correction bias moved off zero below) beside a shared expert.
KIMI_LINEAR = dict(vocab_size=256, hidden_size=64, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24,
                   q_lora_rank=None, moe_intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                   n_shared_experts=1, first_k_dense_replace=1, initializer_range=0.1, max_position_embeddings=512,
                   linear_attn_config=dict(head_dim=16, num_heads=4, short_conv_kernel_size=4, kda_layers=[1, 3],
                                           full_attn_layers=[2]), bos_token_id=1, eos_token_id=2, pad_token_id=0)
# Zamba2: Mamba2 layers (8 heads of 16 in 2 groups), three of them hybrid running 2 shared blocks in turn (0, 1, 0:
# layer 4 reads layer 1's block with its own adapters), attention over [x, embeddings] (4 heads of 32 dims, rotary),
# q/k/v and gate/up adapters of rank 8.
ZAMBA2 = dict(vocab_size=256, hidden_size=64, intermediate_size=48, num_hidden_layers=5, num_attention_heads=4,
              layers_block_type=["mamba", "hybrid", "hybrid", "mamba", "hybrid"], mamba_d_state=16, n_mamba_heads=8,
              mamba_ngroups=2, num_mem_blocks=2, use_shared_attention_adapter=True, adapter_rank=8, use_mem_rope=True,
              chunk_size=16, initializer_range=0.1, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)
# MiniMax: lightning attention (4 heads of 16, a block of 8: transformers' prefill crosses blocks), attention, lightning
# again (its own decay rates); each layer's mixer and MLP residuals weighted away from 1; 2 of 4 experts.
MINIMAX = dict(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
               layer_types=["linear_attention", "full_attention", "linear_attention"], block_size=8,
               full_attn_alpha_factor=1.7, full_attn_beta_factor=0.8, linear_attn_alpha_factor=1.3,
               linear_attn_beta_factor=0.9, mlp_alpha_factor=1.5, mlp_beta_factor=0.7,
               rope_parameters=dict(rope_type="default", rope_theta=1e4),
               initializer_range=0.1, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
PROMPT = np.random.RandomState(2).randint(3, 256, size=40).tolist()
# Bamba's and Qwen3-Next's runs batch 6 and 28 tokens, the longer prefilled over two steps, one preempted; dense
# Granite's (the same layer code) and Nemotron-H's (the state pool's handling is Bamba's) prefill the 28 over two
# steps alone: lighter runs, fewer step programs to compile.
FAMILIES = {
    "dense_granite_hybrid": (transformers.GraniteMoeHybridForCausalLM, transformers.GraniteMoeHybridConfig,
                             DENSE_GRANITE, [PROMPT[2:30]]),
    "bamba": (transformers.BambaForCausalLM, transformers.BambaConfig, BAMBA, [PROMPT[:6], PROMPT[2:30]]),
    "nemotron_h": (transformers.NemotronHForCausalLM, transformers.NemotronHConfig, NEMOTRON_H, [PROMPT[2:30]]),
    "falcon_h1": (transformers.FalconH1ForCausalLM, transformers.FalconH1Config, FALCON_H1, [PROMPT[:6], PROMPT[2:30]]),
    "lfm2": (transformers.Lfm2ForCausalLM, transformers.Lfm2Config, LFM2, [PROMPT[2:30]]),
    "lfm2_moe": (transformers.Lfm2MoeForCausalLM, transformers.Lfm2MoeConfig, LFM2_MOE, [PROMPT[2:30]]),
    "qwen3_next": (transformers.Qwen3NextForCausalLM, transformers.Qwen3NextConfig, QWEN3_NEXT,
                   [PROMPT[:6], PROMPT[2:30]]),
    "kimi_linear": (transformers.KimiLinearForCausalLM, transformers.KimiLinearConfig, KIMI_LINEAR, [PROMPT[2:30]]),
    "zamba2": (hf.Zamba2ForCausalLM, hf.Zamba2Config, ZAMBA2, [PROMPT[2:30]]),
    "minimax": (hf.MiniMaxForCausalLM, hf.MiniMaxConfig, MINIMAX, [PROMPT[2:30]]),
}
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def hf_model(family) -> torch.nn.Module:
    """A random float32 model of the family (1-d parameters and LFM2-MoE's expert_bias buffers moved off their
    init values)."""
    model_class, config_class, config, _ = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(**config)).eval()
    skip_ungrouped_gated_norm(model)
    skip_layer_counted_blocks(model)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(0.1 * torch.randn_like(param))
        for name, buffer in model.named_buffers():
            if name.endswith("expert_bias") or name.endswith("e_score_correction_bias"):
                buffer.add_(0.3 * torch.randn_like(buffer))
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


def test_weights_hold_each_checkpoint_tensor_once(llm):
    """The loaded tree's parameters are the checkpoint's: Zamba2's shared blocks once, not once per hybrid layer."""
    with safe_open(llm.model_dir / "model.safetensors", "numpy") as stored:
        expected = sum(math.prod(stored.get_slice(name).get_shape()) for name in stored.keys()
                       if not name.endswith(IGNORED_SUFFIXES))  # MiniMax's decay buffers: derived, not read
    assert sum(leaf.size for leaf in jax.tree.leaves(llm.weights)) == expected


def test_zamba2_update_reaches_each_use_of_a_shared_block_and_sleep_keeps_it(family, hf_model, llm):
    """A trainer's state dict (each shared block named under every layer running it) with shared block 0's q_proj
    (held by layer 1, run by layers 1 and 4) changed updates both uses as transformers' do; the old state dict
    back, then a sleep and wake, give the first logits again."""
    if family != "zamba2":
        pytest.skip("Zamba2's shared blocks")
    before = llm.logits(PROMPT)
    trained = copy.deepcopy(hf_model)
    with torch.no_grad():
        trained.get_parameter("model.layers.1.shared_transformer.self_attn.q_proj.weight").mul_(-0.5)
        expected = trained(torch.tensor([PROMPT])).logits[0].numpy()
    llm.update_weights(trained.state_dict())
    np.testing.assert_allclose(llm.logits(PROMPT), expected, atol=1e-5 * np.abs(expected).max(), rtol=0)
    llm.update_weights(hf_model.state_dict())
    llm.sleep(level=1)
    llm.wake_up()
    np.testing.assert_array_equal(llm.logits(PROMPT), before)


def test_int8_quantization_with_a_state_layer_first():
    """A tree quantized as it was read (the loader's way) is returned as it is where layer 0 keeps a state and has no
    wq (weight_ops looked for the quantized tree in layer 0's wq, and quantized its quantized leaves again)."""
    cfg = from_hf_config({**QWEN3_NEXT, "architectures": ["Qwen3NextForCausalLM"]})
    weights = jax.tree.map(lambda info: jnp.full(info.shape, 0.1, jnp.float32), abstract_weights(cfg),
                           is_leaf=is_info)
    quantized = quantize_weights(weights, "int8")
    assert quantized.layers[0].wq is None and isinstance(quantized.layers[0].in_qkvz, QuantizedWeight)
    assert quantize_weights(quantized, "int8") is quantized
    assert quantization_of(quantized) == ("int8", 0) and quantization_of(weights) is None  # what a convert records


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


def test_zamba2_config_as_transformers_reads_it():
    """Every layer a Mamba2 one (dt clamped from time_step_min), the hybrid ones keeping K/V too; heads of
    2 x hidden / heads dims scaled by (head_dim / 2) ** -0.5; blocks used in turn, each stored under its first
    hybrid layer; what is not run refused by name."""
    hf = {**ZAMBA2, "architectures": ["Zamba2ForCausalLM"]}
    cfg = from_hf_config(hf)
    ss, blocks = cfg.state_space, cfg.shared_blocks
    assert (ss.layers, ss.inner, ss.n_groups, ss.time_step_limit, ss.norm_eps) == (tuple(range(5)), 128, 2,
                                                                                    (1e-3, math.inf), 1e-5)
    assert [cfg.keeps_kv(i) for i in range(5)] == [False, True, True, False, True]
    assert (cfg.head_dim, cfg.attn_scale, cfg.nope_layers, cfg.activation) == (32, 16**-0.5, (0, 3), "gelu")
    assert (blocks.layers, [blocks.stored_at(i) for i in blocks.layers], blocks.use(4)) == ((1, 2, 4), [1, 2, 1], 2)
    for fields, message in [
        (dict(add_bias_linear=True), "add_bias_linear=True is not supported for Zamba2ForCausalLM"),
        (dict(use_long_context=True), "use_long_context=True is not supported"),
        (dict(num_key_value_heads=2), "num_key_value_heads 2 is not supported for Zamba2ForCausalLM with "
                                      "use_shared_attention_adapter"),
        (dict(layers_block_type=["mamba", "hybrid"]), "layers_block_type .* for each of the 5 layers"),
    ]:
        with pytest.raises(ConfigError, match=message):
            from_hf_config({**hf, **fields})
    assert from_hf_config({**hf, "num_key_value_heads": 2, "use_shared_attention_adapter": False}).num_kv_heads == 2


def test_nemotron_h_config_as_transformers_reads_it():
    """A released config's hybrid_override_pattern (M Mamba2, * attention, - MLP): no layer rotates, dt clamped
    to (time_step_min, inf) as transformers' mixer does; MoE layers ("E") refused by name."""
    hf = {**{k: v for k, v in NEMOTRON_H.items() if k != "layers_block_type"}, "hybrid_override_pattern": "M*-M",
          "architectures": ["NemotronHForCausalLM"], "time_step_min": 0.002}
    cfg = from_hf_config(hf)
    assert (cfg.state_space.layers, cfg.mlp_only_layers, cfg.nope_layers) == ((0, 3), (2,), (0, 1, 2, 3))
    assert cfg.state_space.time_step_limit == (0.002, math.inf) and cfg.activation == "relu2"
    assert cfg.state_space.chunk_size == 16  # the chunked SSD's chunk: a 16-token prefill step runs it
    # Only the attention layer keeps K/V: a page holds one layer's (the MLP layer's buffers are empty, as Mamba2's).
    assert [cfg.keeps_kv(i) for i in range(4)] == [False, True, False, False]
    assert page_bytes(cfg, 16, jnp.float32) == 2 * 16 * cfg.num_kv_heads * cfg.head_dim * 4
    with pytest.raises(ConfigError, match="MoE layers .* not supported for NemotronHForCausalLM"):
        from_hf_config({**hf, "hybrid_override_pattern": "M*E-"})


def test_qwen3_next_config_as_transformers_reads_it():
    """Without layer_types every full_attention_interval-th layer attends (transformers' default: 4); a quarter of
    each head rotates; the DeltaNet's state takes Mamba2's shapes (value heads, value dims, key dims, key heads; q, k
    and v's conv channels); the checkpoint's MTP module is not read; dense MLP layers, value heads not a multiple of
    the key heads and unknown layer types are refused by name, and so are prefix caching and speculation (its MTP
    module's too: the state cannot be rolled back)."""
    hf = {**{k: v for k, v in QWEN3_NEXT.items() if k != "layer_types"}, "num_hidden_layers": 8,
          "architectures": ["Qwen3NextForCausalLM"]}
    cfg = from_hf_config(hf)
    ss = cfg.state_space
    assert (ss.layers, cfg.rotary_dim, cfg.norm_weight_offset) == ((0, 1, 2, 4, 5, 6), 4, 1.0)
    assert (ss.num_heads, ss.head_dim, ss.state_size, ss.n_groups, ss.conv_dim) == (4, 16, 8, 2, 96)
    assert in_mtp_layer(cfg, "mtp.layers.0.mlp.gate.weight") and not in_mtp_layer(cfg, "model.layers.0.mlp.gate.weight")
    with pytest.raises(ConfigError, match="not supported for Qwen3NextForCausalLM: the recurrent state of its state "
                                          r"layers \(Mamba-1, Mamba2, Gated DeltaNet, lightning attention or short "
                                          r"conv\) cannot be rolled back"):
        check_speculation(SpeculativeConfig(method="mtp", num_speculative_tokens=1), cfg)
    with pytest.raises(ConfigError, match="enable_prefix_caching=True is not supported for Qwen3NextForCausalLM"):
        prefix_caching_setting(True, cfg)
    with pytest.raises(ConfigError, match=r"dense MLP layers \[1\] \(mlp_only_layers \[1\].*Qwen3NextForCausalLM"):
        from_hf_config({**hf, "mlp_only_layers": [1]})
    with pytest.raises(ConfigError, match=r"linear_num_value_heads \(3\) must be a multiple of linear_num_key_heads"):
        from_hf_config({**hf, "linear_num_value_heads": 3})
    with pytest.raises(ConfigError, match=r"layer_types \['mamba'.* must list one of \['linear_attention'"):
        from_hf_config({**hf, "layer_types": ["mamba"] * 8})


def test_falcon_h1_config_as_transformers_reads_it():
    """Every layer a state layer that keeps K/V too; the multipliers where the code reads them (the key's on the
    softmax scale, the logits' as logits_scaling); mamba_d_ssm the mixer's width; the gate by mamba_rms_norm and
    mamba_norm_before_gate; in_proj and out_proj biases apart refused by name."""
    hf = {**FALCON_H1, "architectures": ["FalconH1ForCausalLM"]}
    cfg = from_hf_config(hf)
    ss = cfg.state_space
    assert (ss.layers, ss.inner, ss.gate, ss.proj_multipliers) == ((0, 1), 96, "gate", (0.9, 1.1, 1.2, 0.8, 1.3))
    assert cfg.keeps_kv(0) and cfg.keeps_kv(1) and cfg.is_state_layer(0)
    assert (cfg.embedding_multiplier, cfg.logits_scaling, cfg.attn_scale) == (2.0, 2.0, 16**-0.5 * 0.7)
    m = cfg.multipliers
    assert (m.attention_in, m.attention_out, m.ssm_in, m.ssm_out, m.mlp_gate, m.mlp_down) == (0.8, 1.3, 1.2, 0.6, 1.5,
                                                                                              0.7)
    assert from_hf_config({**hf, "mamba_rms_norm": True}).state_space.gate == "norm_then_gate"
    assert from_hf_config({**hf, "mamba_rms_norm": True, "mamba_norm_before_gate": False}).state_space.gate == \
        "norm_gated"
    with pytest.raises(ConfigError, match="mamba_proj_bias and projectors_bias must be equal for FalconH1"):
        from_hf_config({**hf, "projectors_bias": True})
    with pytest.raises(ConfigError, match=r"mamba_n_heads 6 x mamba_d_head 16 must equal mamba_d_ssm \(128\)"):
        from_hf_config({**hf, "mamba_d_ssm": 128})


@pytest.mark.parametrize("norm_before_gate", [True, False, None])
def test_falcon_h1_mixer_gate_matches_transformers(norm_before_gate):
    """The mixer's output meets its gate as transformers' FalconH1RMSNormGated (normed before or after the gate, in
    2 groups), or with no norm (mamba_rms_norm off: y * silu(z))."""
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1RMSNormGated

    torch.manual_seed(0)
    y, z, weight = torch.randn(5, 32), torch.randn(5, 32), 1 + 0.1 * torch.randn(32)
    gate = {True: "norm_then_gate", False: "norm_gated", None: "gate"}[norm_before_gate]
    ss = StateSpace(layers=(0,), num_heads=2, head_dim=16, state_size=4, n_groups=2, conv_kernel=4, norm_eps=1e-5,
                    gate=gate)
    if norm_before_gate is None:
        expected = y * torch.nn.functional.silu(z)
    else:
        norm = FalconH1RMSNormGated(32, eps=1e-5, n_groups=2, norm_before_gate=norm_before_gate)
        with torch.no_grad():
            norm.weight.copy_(weight)
            expected = norm(y, z)
    got = gated_output(ss, y.numpy(), z.numpy(), None if norm_before_gate is None else weight.numpy())
    np.testing.assert_allclose(np.asarray(got), expected.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_lfm2_config_as_transformers_reads_it():
    """Conv layers by layer_types, else the layers full_attn_idxs leaves out; the MLP's width as transformers
    adjusts it; q/k norms; rope theta 1e6 where the config gives none; tie_embedding read; a conv of one tap and
    unknown layer types refused by name."""
    hf = {**LFM2, "architectures": ["Lfm2ForCausalLM"]}
    cfg = from_hf_config(hf)
    ss = cfg.state_space
    assert (ss.layers, ss.conv_dim, ss.conv_kernel, ss.has_ssm, ss.conv_bias) == ((0,), 64, 3, False, True)
    assert (cfg.intermediate_size, cfg.qk_norm, cfg.rope_theta, cfg.keeps_kv(0), cfg.keeps_kv(1)) == (
        96, True, 1e6, False, True)
    released = {**{k: v for k, v in hf.items() if k != "layer_types"}, "num_hidden_layers": 3,
                "full_attn_idxs": [2], "block_ff_dim": 192,
                "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256, "tie_embedding": False}
    cfg = from_hf_config(released)
    assert (cfg.state_space.layers, cfg.intermediate_size, cfg.tie_word_embeddings) == ((0, 1), 256, False)
    with pytest.raises(ConfigError, match="conv_L_cache 1 is not supported for Lfm2ForCausalLM"):
        from_hf_config({**hf, "conv_L_cache": 1})
    with pytest.raises(ConfigError, match=r"layer_types \['conv', 'mamba'\] must list one of"):
        from_hf_config({**hf, "layer_types": ["conv", "mamba"]})


def test_lfm2_moe_config_as_transformers_reads_it():
    """intermediate_size as stored (no block_auto_adjust_ff_dim) for the first num_dense_layers; Lfm2MoeConfig's
    routing defaults; a router without its expert_bias refused by name."""
    hf = {**LFM2_MOE, "architectures": ["Lfm2MoeForCausalLM"]}
    cfg = from_hf_config(hf)
    assert (cfg.intermediate_size, cfg.moe_intermediate_size, cfg.dense_layers, cfg.state_space.layers) == (
        48, 32, (0,), (0, 2))
    assert (cfg.num_experts, cfg.experts_per_token, cfg.norm_topk_prob, cfg.routed_scaling_factor) == (4, 2, True, 1.5)
    defaults = from_hf_config({k: v for k, v in hf.items() if k not in ("num_experts", "num_experts_per_tok",
                                                                         "num_dense_layers", "routed_scaling_factor")})
    assert (defaults.num_experts, defaults.experts_per_token, defaults.dense_layers) == (32, 4, (0, 1))
    with pytest.raises(ConfigError, match="use_expert_bias False is not supported for Lfm2MoeForCausalLM"):
        from_hf_config({**hf, "use_expert_bias": False})


def test_kimi_linear_config_as_transformers_reads_it():
    """A hub config (Moonshot's key names, 1-indexed linear_attn_config, no layer_types): its KDA layers, NoPE
    latent attention at qk_head_dim ** -0.5, the dense first layer, V3's routing; without the lists every fourth
    layer from layer 4 attends; rotary MLA, another router, layer numbers past the layers and GLM-5.3-Flash (KDA
    with hyper-connections) refused by name; transformers' saved names for a dense MLP read as the hub's."""
    hub = {**{k: v for k, v in KIMI_LINEAR.items() if k not in ("num_local_experts", "num_experts_per_tok",
                                                                 "n_shared_experts", "max_position_embeddings")},
           "num_experts": 4, "num_experts_per_token": 2, "num_shared_experts": 1, "num_expert_group": 1,
           "moe_renormalize": True, "model_max_length": 512, "mla_use_nope": True, "num_hidden_layers": 5,
           "architectures": ["KimiLinearForCausalLM"], "linear_attn_config": {
               **KIMI_LINEAR["linear_attn_config"], "kda_layers": [1, 3, 4], "full_attn_layers": [2, 5]}}
    cfg = from_hf_config(hub)
    ss = cfg.state_space
    assert (ss.layers, cfg.nope_layers, cfg.dense_layers, cfg.max_position_embeddings) == ((0, 2, 3), (0, 1, 2, 3, 4),
                                                                                           (0,), 512)
    assert (ss.num_heads, ss.head_dim, ss.state_size, ss.n_groups, ss.conv_dim) == (4, 16, 16, 4, 192)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.norm_topk_prob, cfg.attn_scale) == (4, 2, True, 32**-0.5)
    default = {k: v for k, v in hub.items() if k != "linear_attn_config"}
    assert from_hf_config({**default, "num_hidden_layers": 9}).state_space.layers == (0, 1, 2, 3, 5, 6, 7)
    with pytest.raises(ConfigError, match="mla_use_nope False is not supported for KimiLinearForCausalLM"):
        from_hf_config({**hub, "mla_use_nope": False})
    with pytest.raises(ConfigError, match="moe_router_activation_func 'softmax' is not supported"):
        from_hf_config({**hub, "moe_router_activation_func": "softmax"})
    with pytest.raises(ConfigError, match=r"linear_attn_config kda_layers \[0, 3\] must number layers from 1 to 5"):
        from_hf_config({**hub, "linear_attn_config": {**hub["linear_attn_config"], "kda_layers": [0, 3]}})
    with pytest.raises(ConfigError, match=r"'Glm5NextForConditionalGeneration' is not supported \(GLM-5.3-Flash"):
        from_hf_config({**hub, "architectures": ["Glm5NextForConditionalGeneration"]})
    saved = ["model.layers.0.block_sparse_moe.gate_proj.weight", "model.layers.1.block_sparse_moe.experts.0.w1.weight"]
    assert stored_names(saved) == {"model.layers.0.mlp.gate_proj.weight": saved[0], saved[1]: saved[1]}
    assert stored_names(["model.layers.0.mlp.gate_proj.weight", saved[1]]) == {}


def test_kda_forget_gate_matches_transformers_per_channel_and_past_its_softplus_bound():
    """The log decay per head and key channel, as KimiLinearForgetGate gives it, with inputs past the softplus
    bound (20, where log(1 + exp(x)) would overflow to inf at ~89) taken as themselves."""
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearForgetGate

    torch.manual_seed(0)
    gate = KimiLinearForgetGate(transformers.KimiLinearConfig(**KIMI_LINEAR))
    with torch.no_grad():
        for param in gate.parameters():
            param.copy_(torch.randn_like(param))
        gate.dt_bias[:8] += 150.0  # head 0's first 8 channels far past the bound
        x = torch.randn(1, 5, 64)
        expected = gate(x)[0].numpy()
    ss = from_hf_config({**KIMI_LINEAR, "architectures": ["KimiLinearForCausalLM"]}).state_space
    w = types.SimpleNamespace(f_a=gate.f_a_proj.weight.T.detach().numpy(), f_b=gate.f_b_proj.weight.T.detach().numpy(),
                              dt_bias=gate.dt_bias.detach().numpy(), a_log=gate.A_log.detach().numpy())
    got = np.asarray(forget_gate(ss, w, jnp.asarray(x[0].numpy()) @ w.f_a @ w.f_b))
    assert np.isfinite(got).all() and expected[:, 0, :8].max() < -50  # the bound at work: finite, steep decays
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_lfm3_config_as_transformers_reads_it():
    """Lfm3Config's defaults: every fourth layer from 2 full attention, from 4 sliding (256 tokens, theta 1e4), the
    rest short convs of 7 taps; the full layers' proportional rope turns half the frequencies of theta 1e6. The gate,
    the sandwich norms and unbiased attention are what the release has: the others are refused by name."""
    hf = dict(vocab_size=256, hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
              architectures=["Lfm3ForCausalLM"])
    cfg = from_hf_config(hf)
    assert (cfg.state_space.layers, cfg.layer_windows) == ((0, 1, 3, 5, 7), (0, 0, 0, 0, 256, 0, 0, 0))
    assert (cfg.state_space.conv_kernel, cfg.head_dim, cfg.intermediate_size) == (7, 128, 7680)
    assert (cfg.local_rope_theta, cfg.rope_theta, cfg.rope_scaling.rope_type) == (1e4, 1e6, "proportional")
    assert cfg.rope_scaling.rotated_fraction == 0.5 and cfg.tie_word_embeddings
    for name, value in (("use_attention_gate", False), ("use_sandwich_norm", False), ("attention_bias", True)):
        with pytest.raises(ConfigError, match=f"{name} {value} is not supported for Lfm3ForCausalLM"):
            from_hf_config({**hf, name: value})
    with pytest.raises(ConfigError, match=r"layer_types \['mamba'.* must list one of \['conv', 'sliding_attention'"):
        from_hf_config({**hf, "layer_types": ["mamba"] * 8})


def test_minimax_config_as_transformers_reads_it():
    """MiniMaxConfig's layers by default (every other from layer 1 lightning), the lightning state (heads of head_dim
    keys and values, no conv, chunks of block_size), the residual weights, each lightning layer's decay rates as
    transformers' slope_rate buffer; layer kinds and block sizes it does not run refused by name, and prefix caching
    (naming its lightning layers)."""
    hf_config = {k: v for k, v in MINIMAX.items() if k != "layer_types"}
    config = hf.MiniMaxConfig(**{**hf_config, "num_hidden_layers": 4})
    cfg = from_hf_config({**config.to_dict(), "architectures": ["MiniMaxForCausalLM"]})
    assert config.layer_types == ["full_attention", "linear_attention"] * 2 and cfg.state_space.layers == (1, 3)
    ss = cfg.state_space
    assert (ss.num_heads, ss.head_dim, ss.state_size, ss.conv_kernel, ss.chunk_size) == (4, 16, 16, 1, 8)
    factors = cfg.minimax.full_factors, cfg.minimax.linear_factors, cfg.minimax.mlp_factors
    assert factors == ((1.7, 0.8), (1.3, 0.9), (1.5, 0.7))
    for layer in (1, 3):
        slopes = transformers.models.minimax.modeling_minimax.MiniMaxLightningAttention(config, layer).slope_rate
        np.testing.assert_allclose(decay_rates(4, layer, 4), slopes.flatten().numpy(), rtol=1e-6)
    arch = {"architectures": ["MiniMaxForCausalLM"]}
    with pytest.raises(ConfigError, match=r"layer_types \['mamba'.* must list one of \['full_attention', 'linear_"):
        from_hf_config({**hf_config, **arch, "layer_types": ["mamba"] * 3})
    with pytest.raises(ConfigError, match="block_size 0 is not supported for MiniMaxForCausalLM"):
        from_hf_config({**MINIMAX, **arch, "block_size": 0})
    with pytest.raises(ConfigError, match=r"not supported for MiniMaxForCausalLM: its state layers \(.*lightning"):
        prefix_caching_setting(True, cfg)  # the message names MiniMax's own state layers
