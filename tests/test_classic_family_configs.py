"""Config reading of the classic families (OPT, GPT-J, GPTBigCode, StableLM, Falcon): fields a config leaves out
read as transformers reads them, the settings not run refused by name, OPT's hub file names (no model is run here;
test_hf_parity runs each against HF)."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from jaxinfer import ConfigError, from_hf_config
from jaxinfer.checkpoint.base_model_names import stored_names
from jaxinfer.entrypoints.model_loading import resolve_max_seq_len
from jaxinfer.models.opt import FAMILY as OPT_FAMILY

OPT = dict(vocab_size=8, hidden_size=64, ffn_dim=32, num_hidden_layers=2, num_attention_heads=4)
OPT_FIELDS = [
    {},  # transformers' defaults: ReLU, every projection biased, 2048 positions, tied head
    dict(enable_bias=False, activation_function="gelu", max_position_embeddings=64, tie_word_embeddings=False),
]


@pytest.mark.parametrize("fields", OPT_FIELDS)
def test_opt_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**OPT, **fields, "architectures": ["OPTForCausalLM"]})
    hf = transformers.OPTConfig(**OPT, **fields)
    assert (cfg.learned_positions, cfg.position_offset, cfg.nope_layers) == (True, 2, (0, 1))
    assert (cfg.max_position_embeddings, cfg.intermediate_size) == (hf.max_position_embeddings, hf.ffn_dim)
    assert (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) == (hf.enable_bias,) * 3
    assert (cfg.layer_norm, cfg.norm_bias, cfg.activation) == (True, True, hf.activation_function)
    assert (cfg.tie_word_embeddings, cfg.bos_token_id, cfg.eos_token_ids) == (
        hf.tie_word_embeddings, hf.bos_token_id, (hf.eos_token_id,))
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        resolve_max_seq_len(hf.max_position_embeddings + 1, cfg.max_position_embeddings)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(word_embed_proj_dim=0), "word_embed_proj_dim 0 is not supported for OPTForCausalLM"),
        (dict(_remove_final_layer_norm=True), "_remove_final_layer_norm=True is not supported"),
        (dict(layer_norm_elementwise_affine=False), "layer_norm_elementwise_affine=False is not supported"),
        (dict(activation_function="quick_gelu"), "activation 'quick_gelu' is not supported"),
    ],
)
def test_opt_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**OPT, **fields, "architectures": ["OPTForCausalLM"]})


def test_opt_350m_fields_read_as_its_layout():
    """OPT-350M's post-norm layers and narrower embeddings (test_hf_parity runs them against HF)."""
    cfg = from_hf_config({**OPT, "do_layer_norm_before": False, "word_embed_proj_dim": 32,
                          "architectures": ["OPTForCausalLM"]})
    assert (cfg.post_norm, cfg.word_embed_proj_dim, cfg.embedding_size, cfg.hidden_size) == (True, 32, 32, 64)
    assert from_hf_config({**OPT, "word_embed_proj_dim": 64, "architectures": ["OPTForCausalLM"]}).embedding_size == 64


def test_opt_hub_names_map_to_the_causal_lm_names():
    """The hub's OPT files name the decoder as OPTModel does (`decoder.*`), some beside a tied `lm_head` copy: the
    decoder's names take the family's `model.` prefix, the head keeps its own (the loader drops a tied copy)."""
    names = ("decoder.embed_tokens.weight", "decoder.layers.0.fc1.weight", "lm_head.weight")
    assert stored_names(dict.fromkeys(names, Path("model.safetensors")), OPT_FAMILY.top_names[0]) == {
        "model.decoder.embed_tokens.weight": names[0], "model.decoder.layers.0.fc1.weight": names[1],
        "lm_head.weight": names[2]}


GPTJ = dict(vocab_size=8, n_embd=512, n_layer=2, n_head=4)  # head_dim 128: the default rotary_dim 64 fits


@pytest.mark.parametrize("fields", [{}, dict(rotary_dim=32, n_inner=64, n_positions=128, tie_word_embeddings=True)])
def test_gptj_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**GPTJ, **fields, "architectures": ["GPTJForCausalLM"]})
    hf = transformers.GPTJConfig(**GPTJ, **fields)
    assert (cfg.rotary_dim, cfg.rope_interleaved, cfg.rope_theta, cfg.head_dim) == (hf.rotary_dim, True, 1e4, 128)
    assert (cfg.intermediate_size, cfg.max_position_embeddings) == (hf.n_inner or 4 * hf.n_embd, hf.n_positions)
    assert (cfg.parallel_residual, cfg.layer_norm, cfg.norm_bias, cfg.rms_norm_eps) == (
        True, True, True, hf.layer_norm_epsilon)
    assert (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias, cfg.lm_head_bias) == (False, False, True, True)
    assert (cfg.activation, cfg.tie_word_embeddings, cfg.eos_token_ids) == (
        "gelu_tanh", hf.tie_word_embeddings, (hf.eos_token_id,))


@pytest.mark.parametrize("rotary_dim", [None, 7, 256])
def test_gptj_rotary_dims_that_cannot_run_are_refused_by_name(rotary_dim):
    with pytest.raises(ConfigError, match=f"rotary_dim {rotary_dim} is not supported for GPTJForCausalLM"):
        from_hf_config({**GPTJ, "rotary_dim": rotary_dim, "architectures": ["GPTJForCausalLM"]})


BIGCODE = dict(vocab_size=8, n_embd=64, n_layer=2, n_head=4)


@pytest.mark.parametrize("fields", [{}, dict(multi_query=False, activation_function="gelu", n_inner=32,
                                             scale_attn_weights=False, n_positions=64)])
def test_gpt_bigcode_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**BIGCODE, **fields, "architectures": ["GPTBigCodeForCausalLM"]})
    hf = transformers.GPTBigCodeConfig(**BIGCODE, **fields)
    assert (cfg.num_heads, cfg.num_kv_heads) == (4, 1 if hf.multi_query else 4)
    assert (cfg.learned_positions, cfg.position_offset, cfg.max_position_embeddings) == (True, 0, hf.n_positions)
    assert (cfg.intermediate_size, cfg.attn_scale) == (hf.n_inner or 4 * hf.n_embd, None if hf.scale_attn_weights
                                                       else 1.0)
    assert cfg.activation == ("gelu_tanh" if hf.activation_function == "gelu_pytorch_tanh" else "gelu")
    assert (cfg.tie_word_embeddings, cfg.eos_token_ids) == (hf.tie_word_embeddings, (hf.eos_token_id,))


def test_gpt_bigcode_cross_attention_is_refused_by_name():
    with pytest.raises(ConfigError, match="add_cross_attention=True is not supported for GPTBigCodeForCausalLM"):
        from_hf_config({**BIGCODE, "add_cross_attention": True, "architectures": ["GPTBigCodeForCausalLM"]})


STABLELM = dict(vocab_size=8, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4)


@pytest.mark.parametrize("fields", [
    dict(num_key_value_heads=4),  # transformers' defaults otherwise: a quarter of each head rotated, sequential
    dict(num_key_value_heads=2, use_qkv_bias=True, qk_layernorm=True, use_parallel_residual=True,
         partial_rotary_factor=0.5, rope_theta=1e5, layer_norm_eps=1e-6, tie_word_embeddings=True),  # transformers 4's
])
def test_stablelm_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**STABLELM, **fields, "architectures": ["StableLmForCausalLM"]})
    hf = transformers.StableLmConfig(**STABLELM, **fields)
    rope = hf.rope_parameters
    assert (cfg.rotary_dim, cfg.rope_theta) == (int(16 * rope["partial_rotary_factor"]), rope["rope_theta"])
    assert (cfg.num_kv_heads, cfg.qkv_bias, cfg.o_bias, cfg.qk_norm, cfg.parallel_residual) == (
        hf.num_key_value_heads, hf.use_qkv_bias, False, hf.qk_layernorm, hf.use_parallel_residual)
    assert (cfg.layer_norm, cfg.norm_bias, cfg.rms_norm_eps, cfg.activation) == (True, True, hf.layer_norm_eps, "silu")
    assert (cfg.tie_word_embeddings, cfg.bos_token_id, cfg.eos_token_ids) == (
        hf.tie_word_embeddings, hf.bos_token_id, (hf.eos_token_id,))


def test_stablelm_kv_heads_default_to_transformers_32():
    with pytest.raises(ConfigError, match=r"\(4\) must be a multiple of num_key_value_heads \(32\)"):
        from_hf_config({**STABLELM, "architectures": ["StableLmForCausalLM"]})


FALCON = dict(vocab_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
FALCON_FORMS = [  # (fields, kv heads, parallel, one norm)
    ({}, 1, True, True),  # transformers' defaults: Falcon-7B's layer, multi-query
    (dict(new_decoder_architecture=True, num_kv_heads=2, ffn_hidden_size=32, rope_theta=1e5), 2, True, False),
    (dict(new_decoder_architecture=True, num_ln_in_parallel_attn=1), 4, True, True),  # num_kv_heads: the heads
    (dict(parallel_attn=False, multi_query=False, num_kv_heads=2), 4, False, False),  # num_kv_heads not read
]


@pytest.mark.parametrize("fields, kv_heads, parallel, one_norm", FALCON_FORMS)
def test_falcon_fields_a_config_leaves_out_read_as_transformers_reads_them(fields, kv_heads, parallel, one_norm):
    cfg = from_hf_config({**FALCON, **fields, "architectures": ["FalconForCausalLM"]})
    hf = transformers.FalconConfig(**FALCON, **fields)
    assert (cfg.num_kv_heads, cfg.parallel_residual, cfg.one_norm) == (kv_heads, parallel, one_norm)
    assert (cfg.intermediate_size, cfg.rope_theta, cfg.rotated_dims) == (
        hf.ffn_hidden_size, hf.rope_parameters["rope_theta"], 16)
    assert (cfg.layer_norm, cfg.norm_bias, cfg.rms_norm_eps, cfg.activation) == (
        True, True, hf.layer_norm_epsilon, hf.activation)
    assert (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) == (False, False, False)
    assert (cfg.tie_word_embeddings, cfg.max_position_embeddings, cfg.eos_token_ids) == (
        hf.tie_word_embeddings, hf.max_position_embeddings, (hf.eos_token_id,))


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(new_decoder_architecture=True, num_kv_heads=2, bias=True),
         "bias=True is not supported for FalconForCausalLM with 2 K/V groups of several heads"),
        (dict(new_decoder_architecture=True, parallel_attn=False), "parallel_attn=False is not supported"),
        (dict(new_decoder_architecture=True, num_ln_in_parallel_attn=3), "num_ln_in_parallel_attn 3 is not"),
    ],
)
def test_falcon_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**FALCON, **fields, "architectures": ["FalconForCausalLM"]})


def test_falcon_rw_reads_alibi_scaled_with_the_scores_and_biases():
    """Falcon-RW: no rotary embedding, BLOOM's slopes times 1/sqrt(head_dim) (transformers adds them before the
    scale), every projection biased."""
    cfg = from_hf_config({**FALCON, "alibi": True, "bias": True, "multi_query": False, "parallel_attn": False,
                          "architectures": ["FalconForCausalLM"]})
    assert cfg.nope_layers == (0, 1) and cfg.alibi_slopes == (2**-2 / 4, 2**-4 / 4, 2**-6 / 4, 2**-8 / 4)
    assert (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias, cfg.num_kv_heads) == (True, True, True, 4)


BLOOM = dict(vocab_size=8, n_embed=64, n_layer=2, n_head=4)  # n_embed: older configs' name for hidden_size


def test_bloom_reads_n_embed_and_bloom_slopes_and_refuses_a_post_norm_residual_by_name():
    cfg = from_hf_config({**BLOOM, "architectures": ["BloomForCausalLM"]})
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.nope_layers) == (64, 256, 16, (0, 1))
    assert cfg.alibi_slopes == (2**-2, 2**-4, 2**-6, 2**-8)
    assert (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias, cfg.norm_bias, cfg.tie_word_embeddings) == (True,) * 5
    with pytest.raises(ConfigError, match="apply_residual_connection_post_layernorm=True is not supported"):
        from_hf_config({**BLOOM, "apply_residual_connection_post_layernorm": True,
                        "architectures": ["BloomForCausalLM"]})


MPT = dict(vocab_size=8, d_model=64, n_layers=2, n_heads=4)


def test_mpt_reads_alibi_bias_max_clip_qkv_and_softmax_scale():
    attn = dict(alibi_bias_max=16, clip_qkv=6.0, softmax_scale=0.1)
    cfg = from_hf_config({**MPT, "attn_config": attn, "architectures": ["MptForCausalLM"]})
    assert cfg.alibi_slopes == (2**-4, 2**-8, 2**-12, 2**-16)
    assert (cfg.clip_qkv, cfg.attn_scale, cfg.intermediate_size, cfg.norm_bias, cfg.qkv_bias) == (
        6.0, 0.1, 256, False, False)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(attn_config=dict(alibi=False)),
         "attn_config.alibi=False is not supported for MptForCausalLM .learned position"),
        (dict(attn_config=dict(qk_ln=True)), "attn_config.qk_ln=True is not supported"),
        (dict(attn_config=dict(prefix_lm=True)), "attn_config.prefix_lm=True is not supported"),
        (dict(no_bias=False), "no_bias=False is not supported"),
        (dict(logit_scale=0.5), "logit_scale=0.5 is not supported"),
    ],
)
def test_mpt_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**MPT, **fields, "architectures": ["MptForCausalLM"]})
