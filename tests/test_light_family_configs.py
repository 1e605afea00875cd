"""Config reading of VaultGemma, NanoChat, Persimmon and the other families added beside their neighbours: fields a
config leaves out read as transformers reads them, settings that cannot run refused by name (no model is run)."""

from __future__ import annotations

import pytest
from hf_models import hf

from jaxinfer import ConfigError, from_hf_config

TINY = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=4, num_attention_heads=4)
VAULTGEMMA = {**TINY, "architectures": ["VaultGemmaForCausalLM"]}


def test_vaultgemma_fields_a_config_leaves_out_read_as_transformers_reads_them():
    cfg, ref = from_hf_config(VAULTGEMMA), hf.VaultGemmaConfig(**TINY)
    windows = tuple(ref.sliding_window if t == "sliding_attention" else 0 for t in ref.layer_types)
    assert cfg.layer_windows == windows == (4096, 0, 4096, 0)
    assert (cfg.attn_soft_cap, cfg.final_soft_cap, cfg.attn_scale) == (
        ref.attn_logit_softcapping, ref.final_logit_softcapping, ref.query_pre_attn_scalar**-0.5)
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.tie_word_embeddings) == (
        ref.head_dim, ref.num_key_value_heads, ref.tie_word_embeddings)
    assert cfg.scale_embeddings and cfg.norm_weight_offset == 1.0 and cfg.activation == "gelu_tanh"


def test_vaultgemma_configs_that_cannot_run_are_refused_by_name():
    with pytest.raises(ConfigError, match="use_bidirectional_attention=True"):
        from_hf_config({**VAULTGEMMA, "use_bidirectional_attention": True})
    with pytest.raises(ConfigError, match="mlp_bias=True is not supported for VaultGemmaForCausalLM"):
        from_hf_config({**VAULTGEMMA, "mlp_bias": True})


PERSIMMON = {**TINY, "architectures": ["PersimmonForCausalLM"]}


def test_persimmon_fields_a_config_leaves_out_read_as_transformers_reads_them():
    cfg, ref = from_hf_config(PERSIMMON), hf.PersimmonConfig(**TINY)
    rope = ref.rope_parameters
    assert (cfg.rotary_dim, cfg.rope_theta) == (int(16 * rope["partial_rotary_factor"]), rope["rope_theta"])
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps) == (4, 16, ref.layer_norm_eps)
    assert (cfg.qk_norm, cfg.activation, cfg.tie_word_embeddings) == (
        ref.qk_layernorm, "relu2", ref.tie_word_embeddings)
    assert (cfg.max_position_embeddings, cfg.bos_token_id, cfg.eos_token_ids) == (
        ref.max_position_embeddings, ref.bos_token_id, (ref.eos_token_id,))
    assert cfg.layer_norm and cfg.norm_bias and cfg.qkv_bias and cfg.o_bias and cfg.mlp_bias
    assert not cfg.parallel_residual


@pytest.mark.parametrize("fields,message", [
    (dict(hidden_size=66), "hidden_size \\(66\\) must be a multiple of num_attention_heads \\(4\\)"),
    (dict(partial_rotary_factor=0.3125), "partial_rotary_factor 0.3125"),
    (dict(layer_types=["sliding_attention"] * 4), "not supported for PersimmonForCausalLM"),
    (dict(hidden_act="swish_glu"), "activation 'swish_glu' is not supported"),
])
def test_persimmon_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**PERSIMMON, **fields})


JETMOE = {"vocab_size": 8, "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 2,
          "architectures": ["JetMoeForCausalLM"]}


def test_jetmoe_fields_a_config_leaves_out_read_as_transformers_reads_them():
    cfg, ref = from_hf_config(JETMOE), hf.JetMoeConfig(**{k: v for k, v in JETMOE.items() if k != "architectures"})
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        ref.num_attention_heads, ref.num_key_value_heads, ref.kv_channels) == (32, 16, 128)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size) == (
        ref.num_local_experts, ref.num_experts_per_tok, ref.intermediate_size)
    assert (cfg.activation, cfg.tie_word_embeddings, cfg.rms_norm_eps, cfg.rope_theta) == (
        ref.activation_function, ref.tie_word_embeddings, ref.rms_norm_eps, ref.rope_parameters["rope_theta"])


@pytest.mark.parametrize("fields,message", [
    (dict(num_experts_per_tok=9), "num_experts_per_tok 9 must be in \\[1, num_local_experts \\(8\\)\\]"),
    (dict(activation_function="swish_glu"), "activation 'swish_glu' is not supported"),
    (dict(layer_types=["sliding_attention"] * 2), "not supported for JetMoeForCausalLM"),
])
def test_jetmoe_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**JETMOE, **fields})


NANOCHAT = {**TINY, "architectures": ["NanoChatForCausalLM"]}


def test_nanochat_fields_a_config_leaves_out_read_as_transformers_reads_them():
    cfg, ref = from_hf_config(NANOCHAT), hf.NanoChatConfig(**TINY)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps) == (ref.num_key_value_heads, 16, ref.rms_norm_eps)
    assert (cfg.final_soft_cap, cfg.activation, cfg.tie_word_embeddings) == (
        ref.final_logit_softcapping, ref.hidden_act, ref.tie_word_embeddings)
    assert (cfg.qkv_bias, cfg.o_bias, cfg.rope_theta) == (False, False, ref.rope_parameters["rope_theta"])
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (ref.bos_token_id, (ref.eos_token_id,))
    assert cfg.weightless_norms and cfg.embed_norm
    assert from_hf_config({**NANOCHAT, "final_logit_softcapping": None}).final_soft_cap is None


@pytest.mark.parametrize("fields,message", [
    (dict(mlp_bias=True), "mlp_bias=True is not supported for NanoChatForCausalLM"),
    (dict(layer_types=["sliding_attention"] * 4), "not supported for NanoChatForCausalLM"),
    (dict(hidden_act="swish_glu"), "activation 'swish_glu' is not supported"),
])
def test_nanochat_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**NANOCHAT, **fields})


GPT_NEO = {"vocab_size": 8, "hidden_size": 64, "num_layers": 24, "num_heads": 4, "architectures": ["GPTNeoForCausalLM"]}


def test_gpt_neo_fields_a_config_leaves_out_read_as_transformers_reads_them():
    cfg = from_hf_config(GPT_NEO)
    ref = hf.GPTNeoConfig(**{k: v for k, v in GPT_NEO.items() if k != "architectures"})
    assert cfg.layer_windows == tuple(ref.window_size if kind == "local" else 0 for kind in ref.attention_layers)
    assert cfg.layer_windows[:2] == (0, 256)
    assert (cfg.intermediate_size, cfg.head_dim, cfg.attn_scale, cfg.rms_norm_eps) == (256, 16, 1.0,
                                                                                      ref.layer_norm_epsilon)
    assert (cfg.activation, cfg.tie_word_embeddings, cfg.max_position_embeddings) == (
        "gelu_tanh", ref.tie_word_embeddings, ref.max_position_embeddings)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (ref.bos_token_id, (ref.eos_token_id,))
    assert cfg.learned_positions and not cfg.qkv_bias and cfg.o_bias and cfg.nope_layers == tuple(range(24))


@pytest.mark.parametrize("fields,message", [
    (dict(attention_types=[[["global", "local"], 2]]), "expands to .*for each of its 24 layers"),
    (dict(attention_types=[[["global", "sliding"], 12]]), "needs one of \\('global', 'local'\\)"),
    (dict(hidden_size=66), "hidden_size \\(66\\) must be a multiple of num_heads \\(4\\)"),
    (dict(window_size=0), "window_size 0 must be >= 1"),
])
def test_gpt_neo_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**GPT_NEO, **fields})


CODEGEN = {"vocab_size": 8, "n_embd": 512, "n_layer": 2, "n_head": 4, "architectures": ["CodeGenForCausalLM"]}


def test_codegen_fields_a_config_leaves_out_read_as_transformers_reads_them():
    cfg = from_hf_config(CODEGEN)
    ref = hf.CodeGenConfig(**{k: v for k, v in CODEGEN.items() if k != "architectures"})
    assert (cfg.rotary_dim, cfg.intermediate_size, cfg.max_position_embeddings) == (ref.rotary_dim, 4 * 512,
                                                                                    ref.n_positions)
    assert (cfg.tie_word_embeddings, cfg.rms_norm_eps, cfg.bos_token_id) == (
        ref.tie_word_embeddings, ref.layer_norm_epsilon, ref.bos_token_id)
    assert cfg.rope_interleaved and cfg.parallel_residual and cfg.lm_head_bias and cfg.activation == "gelu_tanh"


@pytest.mark.parametrize("fields,message", [
    (dict(n_head=6, n_embd=384), "n_head 6 is not supported for CodeGenForCausalLM: .* a multiple of 4"),
    (dict(n_head=2, n_embd=256), "n_head 2 is not supported"),
    (dict(rotary_dim=7), "rotary_dim 7 is not supported for CodeGenForCausalLM"),
])
def test_codegen_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**CODEGEN, **fields})


FLINT = {**TINY, "architectures": ["FlintForCausalLM"], "num_hidden_layers": 9}


def test_flint_fields_a_config_leaves_out_read_as_transformers_reads_them():
    cfg, ref = from_hf_config(FLINT), hf.FlintConfig(**{**TINY, "num_hidden_layers": 9})
    full = tuple(i for i, kind in enumerate(ref.layer_types) if kind == "full_attention")
    assert cfg.nope_layers == full == (0, 1, 5, 8)
    assert cfg.layer_windows == tuple(0 if i in full else ref.sliding_window for i in range(9))
    assert cfg.dense_layers == tuple(ref.mlp_only_layers) == (0, 1)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size) == (
        ref.num_experts, ref.num_experts_per_tok, ref.moe_intermediate_size, ref.shared_expert_intermediate_size)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.norm_topk_prob, cfg.tie_word_embeddings) == (
        ref.num_key_value_heads, ref.head_dim, ref.norm_topk_prob, ref.tie_word_embeddings)
    assert cfg.qk_norm and cfg.norm_scale_first and cfg.rope_theta == ref.rope_parameters["rope_theta"]


@pytest.mark.parametrize("fields,message", [
    (dict(layer_types=["chunked_attention"] * 9), "layer_types .* must give one of"),
    (dict(sliding_window=0), "sliding_window 0 must be >= 1"),
    (dict(num_experts_per_tok=300), "num_experts_per_tok 300 must be in \\[1, num_experts \\(256\\)\\]"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step 0 must be >= 1"),
])
def test_flint_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**FLINT, **fields})


AXK1 = {**TINY, "num_hidden_layers": 3, "architectures": ["AXK1ForCausalLM"]}


def test_axk1_fields_a_config_leaves_out_read_as_transformers_reads_them():
    cfg, ref = from_hf_config(AXK1), hf.AXK1Config(**{**TINY, "num_hidden_layers": 3})
    assert cfg.dense_layers == tuple(i for i, kind in enumerate(ref.mlp_layer_types) if kind == "dense") == (0,)
    mla = cfg.latent_attention
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_rope_head_dim, mla.v_head_dim) == (
        ref.q_lora_rank, ref.kv_lora_rank, ref.qk_rope_head_dim, ref.v_head_dim)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.expert_groups, cfg.expert_groups_per_token) == (
        ref.n_routed_experts, ref.num_experts_per_tok, ref.n_group, ref.topk_group)
    assert (cfg.routed_scaling_factor, cfg.norm_topk_prob, cfg.rope_interleaved) == (
        ref.routed_scaling_factor, ref.norm_topk_prob, ref.rope_interleave)
    assert (cfg.bos_token_id, cfg.eos_token_ids, cfg.tie_word_embeddings) == (
        ref.bos_token_id, (ref.eos_token_id,), ref.tie_word_embeddings)
    legacy = from_hf_config({**AXK1, "first_k_dense_replace": 0, "moe_layer_freq": 2})
    assert legacy.dense_layers == (1,)  # sparse where i >= 0 and i % 2 == 0, as AXK1Config derives it


@pytest.mark.parametrize("fields,message", [
    (dict(q_lora_rank=None), "q_lora_rank None is not supported for AXK1ForCausalLM"),
    (dict(topk_method="greedy"), "topk_method 'greedy' is not supported"),
    (dict(mlp_layer_types=["dense", "moe", "sparse"]), "mlp_layer_types .* must give one of"),
    (dict(moe_layer_freq=0), "moe_layer_freq 0 must be >= 1"),
    (dict(attention_bias=True), "attention_bias=True is not supported for AXK1ForCausalLM"),
])
def test_axk1_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**AXK1, **fields})


BITNET_TINY = {**TINY, "hidden_size": 80, "num_attention_heads": 20}  # 5 KV heads by default: 4 queries each
BITNET = {**BITNET_TINY, "architectures": ["BitNetForCausalLM"]}


def test_bitnet_fields_a_config_leaves_out_read_as_transformers_reads_them():
    cfg, ref = from_hf_config(BITNET), hf.BitNetConfig(**BITNET_TINY)
    assert (cfg.rope_theta, cfg.activation, cfg.rms_norm_eps) == (ref.rope_parameters["rope_theta"], ref.hidden_act,
                                                                  ref.rms_norm_eps) == (500000.0, "relu2", 1e-5)
    assert (cfg.num_kv_heads, cfg.tie_word_embeddings, cfg.bos_token_id, cfg.eos_token_ids) == (
        ref.num_key_value_heads, ref.tie_word_embeddings, ref.bos_token_id, (ref.eos_token_id,))


@pytest.mark.parametrize("fields,message", [
    (dict(quantization_config={"quant_method": "bitnet", "linear_class": "bitlinear"}),
     "quant_method 'bitnet' is not supported: BitNet's ternary weights packed four to a byte .* weight-only"),
    (dict(head_dim=8), "head_dim 8 is not supported for BitNetForCausalLM: attn_sub_norm spans hidden_size"),
    (dict(attention_bias=True), "attention_bias=True is not supported for BitNetForCausalLM"),
])
def test_bitnet_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**BITNET, **fields})


LARA_TINY = {k: v for k, v in TINY.items() if k != "intermediate_size"}  # LaraMiniConfig has none
LARA_MINI = {**LARA_TINY, "num_hidden_layers": 7, "architectures": ["LaraMiniForCausalLM"]}


def test_lara_mini_fields_a_config_leaves_out_read_as_transformers_reads_them():
    cfg, ref = from_hf_config(LARA_MINI), hf.LaraMiniConfig(**{**LARA_TINY, "num_hidden_layers": 7})
    kinds = ref.layer_types  # the released period of 5: linear, sliding, linear, full, sliding
    assert cfg.state_space.layers == tuple(i for i, k in enumerate(kinds) if k == "linear_attention") == (0, 2, 5)
    assert cfg.nope_layers == tuple(i for i, k in enumerate(kinds) if k == "full_attention") == (3,)
    assert cfg.layer_windows == tuple(ref.sliding_window if k == "sliding_attention" else 0 for k in kinds)
    ss = cfg.state_space
    assert (ss.n_groups, ss.num_heads, ss.state_size, ss.head_dim, ss.conv_kernel) == (
        ref.linear_num_key_heads, ref.linear_num_value_heads, ref.linear_key_head_dim, ref.linear_value_head_dim,
        ref.linear_conv_kernel_dim)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size) == (
        ref.num_experts, ref.num_experts_per_tok, ref.moe_intermediate_size, ref.shared_expert_intermediate_size)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.tie_word_embeddings, cfg.eos_token_ids) == (
        ref.num_key_value_heads, ref.head_dim, ref.tie_word_embeddings, (ref.eos_token_id,))
    assert (cfg.norm_weight_offset, cfg.rotary_dim, cfg.qk_norm, cfg.norm_scale_first) == (0.0, 0, True, True)


@pytest.mark.parametrize("fields,message", [
    (dict(layer_types=["linear_attention", "chunked_attention"] * 3 + ["full_attention"]), "layer_types .* must give"),
    (dict(sliding_window=0), "sliding_window 0 must be >= 1"),
    (dict(num_experts_per_tok=200), "num_experts_per_tok 200 must be in \\[1, num_experts \\(128\\)\\]"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
     "partial_rotary_factor 0.5 is not supported for LaraMiniForCausalLM"),
    (dict(attention_bias=True), "attention_bias=True is not supported for LaraMiniForCausalLM"),
    (dict(linear_num_value_heads=12), "linear_num_value_heads \\(12\\) must be a multiple"),
])
def test_lara_mini_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**LARA_MINI, **fields})


AXK2 = {**TINY, "num_hidden_layers": 3, "architectures": ["AXK2ForCausalLM"]}


def test_axk2_fields_a_config_leaves_out_read_as_transformers_reads_them():
    cfg, ref = from_hf_config(AXK2), hf.AXK2Config(**{**TINY, "num_hidden_layers": 3})
    assert cfg.dense_layers == tuple(i for i, kind in enumerate(ref.mlp_layer_types) if kind == "dense") == (0,)
    mla = cfg.latent_attention
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim, mla.v_head_dim) == (
        ref.q_lora_rank, ref.kv_lora_rank, ref.qk_rope_head_dim, ref.qk_nope_head_dim, ref.v_head_dim)
    assert (mla.indexer.index_topk, mla.indexer.index_head_dim, mla.indexer.index_n_heads) == (
        ref.index_topk, ref.index_head_dim, ref.index_n_heads)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.routed_scaling_factor, cfg.norm_topk_prob) == (
        ref.n_routed_experts, ref.num_experts_per_tok, ref.routed_scaling_factor, ref.norm_topk_prob)
    assert ref.n_group is None and (cfg.expert_groups, cfg.expert_groups_per_token) == (1, 1)
    assert (cfg.gated_norm_rank, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size) == (
        ref.gated_norm_rank, ref.moe_intermediate_size, ref.n_shared_experts * ref.moe_intermediate_size)
    assert (cfg.bos_token_id, cfg.eos_token_ids, cfg.tie_word_embeddings, cfg.rope_interleaved, cfg.mtp_layers) == (
        ref.bos_token_id, (ref.eos_token_id,), ref.tie_word_embeddings, True, 0)
    grouped = from_hf_config({**AXK2, "n_group": 8, "topk_group": 4})
    assert (grouped.expert_groups, grouped.expert_groups_per_token) == (8, 4)


@pytest.mark.parametrize("fields,message", [
    (dict(q_lora_rank=None), "q_lora_rank None is not supported for AXK2ForCausalLM"),
    (dict(n_group=8), "n_group 8 and topk_group None must be set together"),
    (dict(layer_types=["indexed_attention", "full_attention", "indexed_attention"]), "layer_types .* is not supported"),
    (dict(mlp_layer_types=["dense", "moe", "sparse"]), "mlp_layer_types .* must give one of"),
    (dict(gated_norm_rank=0), "gated_norm_rank 0 must be >= 1"),
    (dict(attention_bias=True), "attention_bias=True is not supported for AXK2ForCausalLM"),
])
def test_axk2_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**AXK2, **fields})


def test_diffllama_cache_heads_and_refusals_as_transformers_reads_them():
    """DiffLlama's cached heads are twice head_dim (keys padded, each value pair side by side), rotary over the first
    head_dim and scores scaled by its inverse root; an odd K/V head count and attention dropout, which transformers
    refuses to build, are refused by name."""
    base = {**TINY, "num_key_value_heads": 2, "architectures": ["DiffLlamaForCausalLM"]}
    cfg = from_hf_config(base)
    assert (cfg.head_dim, cfg.rotary_dim, cfg.attn_scale, cfg.tie_word_embeddings) == (32, 16, 0.25, False)
    for fields, message in (({"num_key_value_heads": 1}, "num_key_value_heads 1 is not supported"),
                            ({"attention_dropout": 0.1}, "attention_dropout 0.1 is not supported")):
        with pytest.raises(ConfigError, match=f"{message} for DiffLlamaForCausalLM"):
            from_hf_config({**base, **fields})
