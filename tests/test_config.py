"""ModelConfig from HF configs: presets, both transformers layouts, per-family flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from jaxinfer import ConfigError, from_hf_config

PRESETS = sorted((Path(__file__).parents[1] / "configs").glob("*.json"))


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_presets_parse_to_their_json_values(path):
    hf = json.loads(path.read_text())
    cfg = from_hf_config(hf)
    heads = hf["num_attention_heads"]
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size) == (
        hf["vocab_size"], hf["hidden_size"], hf["intermediate_size"])
    assert (cfg.num_layers, cfg.num_heads) == (hf["num_hidden_layers"], heads)
    if hf.get("kv_lora_rank"):  # latent attention caches one row: the latent and the shared rotated key
        assert (cfg.num_kv_heads, cfg.head_dim) == (1, hf["kv_lora_rank"] + hf["qk_rope_head_dim"])
    else:
        assert cfg.num_kv_heads == hf.get("num_key_value_heads", heads)
        assert cfg.head_dim == (hf.get("head_dim") or hf["hidden_size"] // heads)
    eos = hf.get("eos_token_id")
    assert cfg.eos_token_ids == tuple(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    types = hf.get("layer_types") or ["full_attention"] * cfg.num_layers  # GPT-OSS's presets alternate
    assert cfg.layer_windows == tuple(hf["sliding_window"] if t == "sliding_attention" else 0 for t in types)
    rope = hf.get("rope_parameters") or {}
    assert cfg.architecture == hf["architectures"][0] and cfg.rms_norm_eps == hf["rms_norm_eps"]
    assert cfg.rope_theta == hf.get("rope_theta", rope.get("rope_theta"))
    assert cfg.rope_scaling.rope_type == rope.get("rope_type", "default")
    assert (cfg.max_position_embeddings, cfg.tie_word_embeddings) == (
        hf["max_position_embeddings"], hf["tie_word_embeddings"])


def test_llama3_rope_without_an_original_context_takes_the_models_own_as_transformers_does():
    hf = dict(architectures=["LlamaForCausalLM"], vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
              num_attention_heads=2, max_position_embeddings=4096,
              rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0))
    assert from_hf_config(hf).rope_scaling.original_max_position_embeddings == 4096


def test_transformers4_layout_with_rope_scaling():
    cfg = from_hf_config(dict(
        architectures=["LlamaForCausalLM"], vocab_size=8, hidden_size=8, intermediate_size=8,
        num_hidden_layers=1, num_attention_heads=2, rope_theta=500000.0,
        rope_scaling=dict(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
    ))
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling.rope_type == "llama3"
    assert cfg.num_kv_heads == 2 and cfg.head_dim == 4


def test_family_flags():
    base = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=4, num_attention_heads=2)
    qwen2 = from_hf_config({**base, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True,
                            "sliding_window": 32, "max_window_layers": 2})
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.layer_windows == (0, 0, 32, 32)
    gemma = from_hf_config({**base, "architectures": ["GemmaForCausalLM"]})
    assert gemma.norm_weight_offset == 1.0 and gemma.scale_embeddings and gemma.tie_word_embeddings
    assert gemma.activation == "gelu_tanh" and gemma.layer_windows == (0,) * 4
    mistral = from_hf_config({**base, "architectures": ["MistralForCausalLM"], "sliding_window": 16})
    assert mistral.layer_windows == (16,) * 4
    qwen3 = from_hf_config({**base, "architectures": ["Qwen3ForCausalLM"], "head_dim": 16})
    assert qwen3.qk_norm and qwen3.head_dim == 16


def test_gqa_mismatch_is_explained():
    with pytest.raises(ConfigError, match="must be a multiple of num_key_value_heads"):
        from_hf_config(dict(architectures=["LlamaForCausalLM"], vocab_size=8, hidden_size=12,
                            intermediate_size=8, num_hidden_layers=1, num_attention_heads=3,
                            num_key_value_heads=2))


BASE = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=4, num_attention_heads=2)


@pytest.mark.parametrize(
    "arch,fields,expected",
    [
        ("LlamaForCausalLM", dict(hidden_act="gelu"), "gelu"),  # exact erf GELU, as ACT2FN["gelu"]
        ("LlamaForCausalLM", dict(hidden_act="gelu_pytorch_tanh"), "gelu_tanh"),
        ("LlamaForCausalLM", {}, "silu"),
        ("GemmaForCausalLM", dict(hidden_act="gelu"), "gelu_tanh"),  # Gemma's legacy name for tanh
        ("GemmaForCausalLM", dict(hidden_act="gelu", hidden_activation="gelu_pytorch_tanh"), "gelu_tanh"),
        ("GemmaForCausalLM", {}, "gelu_tanh"),
    ],
)
def test_activation_follows_transformers(arch, fields, expected):
    assert from_hf_config({**BASE, "architectures": [arch], **fields}).activation == expected


def test_gemma_activations_that_transformers_versions_read_differently_are_rejected():
    with pytest.raises(ConfigError, match="hidden_activation 'silu' and hidden_act 'gelu'"):
        from_hf_config({**BASE, "architectures": ["GemmaForCausalLM"], "hidden_act": "gelu",
                        "hidden_activation": "silu"})


def test_unknown_activation_names_what_is_supported():
    with pytest.raises(ConfigError, match="activation 'quick_gelu' is not supported; supported: silu"):
        from_hf_config({**BASE, "architectures": ["LlamaForCausalLM"], "hidden_act": "quick_gelu"})


@pytest.mark.parametrize("arch", ["Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_qwen_sliding_layers(arch):
    qwen = {**BASE, "architectures": [arch], "head_dim": 4, "sliding_window": 32}
    assert from_hf_config({**qwen, "use_sliding_window": True, "max_window_layers": 1}).layer_windows == (0, 32, 32, 32)
    types = ["sliding_attention", "full_attention"] * 2
    assert from_hf_config({**qwen, "use_sliding_window": True, "layer_types": types}).layer_windows == (32, 0, 32, 0)
    # transformers drops sliding_window unless use_sliding_window is set: every layer attends fully.
    assert from_hf_config({**qwen, "layer_types": types}).layer_windows == (0,) * 4
    # max_window_layers defaults to 28 in transformers: a 4-layer model has no sliding layer.
    assert from_hf_config({**qwen, "use_sliding_window": True}).layer_windows == (0,) * 4


@pytest.mark.parametrize(
    "arch,types,message",
    [
        ("LlamaForCausalLM", ["sliding_attention"] * 4, "not supported for LlamaForCausalLM"),
        ("Qwen3ForCausalLM", ["full_attention"] * 3, "for each of the 4 layers"),
        ("Qwen3ForCausalLM", ["chunked_attention"] * 4, "must list one of"),
    ],
)
def test_layer_types_that_cannot_run_are_rejected(arch, types, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**BASE, "architectures": [arch], "head_dim": 4, "layer_types": types})


def test_layer_types_matching_the_architecture_are_accepted():
    llama = from_hf_config({**BASE, "architectures": ["LlamaForCausalLM"], "layer_types": ["full_attention"] * 4})
    assert llama.layer_windows == (0,) * 4


SMOLLM3 = dict(architectures=["SmolLM3ForCausalLM"], vocab_size=8, hidden_size=8, intermediate_size=8,
               num_hidden_layers=8, num_attention_heads=2)


def test_smollm3_reads_its_layers_without_rope_and_windows_as_transformers_does():
    defaults = from_hf_config(SMOLLM3)  # transformers' default list: every 4th layer without rope; tied head
    assert defaults.nope_layers == (3, 7) and defaults.tie_word_embeddings and defaults.layer_windows == (0,) * 8
    listed = from_hf_config({**SMOLLM3, "no_rope_layers": [1, 0] * 4, "sliding_window": 4,
                             "layer_types": ["sliding_attention", "full_attention"] * 4})
    assert listed.nope_layers == (1, 3, 5, 7) and listed.layer_windows == (0,) * 8  # no use_sliding_window
    sliding = from_hf_config({**SMOLLM3, "use_sliding_window": True, "sliding_window": 4,
                              "layer_types": ["sliding_attention", "full_attention"] * 4})
    assert sliding.layer_windows == (4, 0) * 4
    with pytest.raises(ConfigError, match="no_rope_layers has 3 entries for 8 layers"):
        from_hf_config({**SMOLLM3, "no_rope_layers": [1, 0, 1]})


OLMO3 = dict(architectures=["Olmo3ForCausalLM"], vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=8,
             num_attention_heads=2)


def test_olmo3_reads_its_windows_and_per_layer_type_rope_as_transformers_does():
    cfg = from_hf_config(OLMO3)  # transformers' defaults: 3 sliding layers of 4096 per full one, theta 500000
    assert cfg.layer_windows == (4096, 4096, 4096, 0) * 2 and (cfg.rope_theta, cfg.local_rope_theta) == (5e5, 5e5)
    yarn = dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=8192, rope_theta=5e5)
    plain = dict(rope_type="default", rope_theta=5e5)
    per_type = from_hf_config({**OLMO3, "rope_parameters": {"full_attention": yarn, "sliding_attention": plain}})
    scaling = {k: v for k, v in yarn.items() if k != "rope_theta"}
    legacy = from_hf_config({**OLMO3, "rope_theta": 5e5, "rope_scaling": scaling})
    for read in (per_type, legacy):  # yarn on the full layers only; the sliding ones unscaled
        assert read.rope_scaling.rope_type == "yarn" and read.local_rope_theta == 5e5
    with pytest.raises(ConfigError, match="Olmo3ForCausalLM sliding layers' rope"):
        from_hf_config({**OLMO3, "rope_parameters": {"full_attention": yarn, "sliding_attention": yarn}})


GLM = dict(vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=2, num_attention_heads=2)
GLM_ROPE = [  # transformers' order: partial_rotary_factor in the rope parameters, else at the top level, else 0.5
    {},
    dict(partial_rotary_factor=0.25, rope_theta=500.0),
    dict(partial_rotary_factor=0.25, rope_parameters=dict(rope_type="default", rope_theta=5.0)),
    dict(partial_rotary_factor=0.25, rope_parameters=dict(rope_type="default", partial_rotary_factor=0.75)),
    dict(rope_scaling=dict(rope_type="yarn", factor=4.0, partial_rotary_factor=1.0), max_position_embeddings=64),
]


@pytest.mark.parametrize("arch", ["GlmForCausalLM", "Glm4ForCausalLM"])
@pytest.mark.parametrize("fields", GLM_ROPE)
def test_glm_fields_a_config_leaves_out_read_as_transformers_reads_them(arch, fields):
    ours = from_hf_config({**GLM, **fields, "architectures": [arch]})
    theirs = getattr(transformers, arch).config_class(**GLM, **fields)
    rope = theirs.rope_parameters
    assert (ours.num_kv_heads, ours.head_dim, ours.rms_norm_eps, ours.max_position_embeddings) == (
        theirs.num_key_value_heads, theirs.head_dim, theirs.rms_norm_eps, theirs.max_position_embeddings)
    assert (ours.qkv_bias, ours.o_bias, ours.tie_word_embeddings) == (theirs.attention_bias, False, False)
    assert ours.eos_token_ids == tuple(theirs.eos_token_id) and ours.activation == theirs.hidden_act
    assert (ours.rope_theta, ours.rope_scaling.rope_type) == (rope["rope_theta"], rope["rope_type"])
    assert ours.rotated_dims == int(theirs.head_dim * rope["partial_rotary_factor"]) and ours.rope_interleaved


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(partial_rotary_factor=1.5), "partial_rotary_factor 1.5 must be in"),
        (dict(head_dim=10), r"an even number of the 10 head dims \(it turns 5\)"),
        (dict(rope_scaling=dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0])), "'longrope' is read"),
        (dict(layer_types=["sliding_attention"] * 2, sliding_window=4), "not supported for GlmForCausalLM"),
    ],
)
def test_glm_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**GLM, **fields, "architectures": ["GlmForCausalLM"]})


GLM4_MOE = dict(vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=4, num_attention_heads=2)
GLM4_MOE_ROUTING = dict(n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3, moe_intermediate_size=4,
                        n_shared_experts=2, first_k_dense_replace=3, routed_scaling_factor=2.5, norm_topk_prob=False,
                        use_qk_norm=True, attention_bias=True, num_nextn_predict_layers=2)


@pytest.mark.parametrize("fields", [*GLM_ROPE, GLM4_MOE_ROUTING])
def test_glm4_moe_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    ours = from_hf_config({**GLM4_MOE, **fields, "architectures": ["Glm4MoeForCausalLM"]})
    theirs = transformers.Glm4MoeConfig(**GLM4_MOE, **fields)
    rope, head_dim = theirs.rope_parameters, theirs.hidden_size // theirs.num_attention_heads
    assert (ours.num_experts, ours.experts_per_token, ours.moe_intermediate_size) == (
        theirs.n_routed_experts, theirs.num_experts_per_tok, theirs.moe_intermediate_size)
    assert ours.shared_expert_intermediate_size == theirs.n_shared_experts * theirs.moe_intermediate_size
    assert (ours.expert_groups, ours.expert_groups_per_token, ours.routed_scaling_factor, ours.norm_topk_prob) == (
        theirs.n_group, theirs.topk_group, theirs.routed_scaling_factor, theirs.norm_topk_prob)
    assert ours.dense_layers == tuple(range(theirs.first_k_dense_replace)) and ours.mtp_layers == theirs.num_mtp_layers
    assert (ours.qkv_bias, ours.o_bias, ours.qk_norm) == (theirs.attention_bias, False, theirs.use_qk_norm)
    assert (ours.rms_norm_eps, ours.max_position_embeddings, ours.tie_word_embeddings, ours.activation) == (
        theirs.rms_norm_eps, theirs.max_position_embeddings, theirs.tie_word_embeddings, theirs.hidden_act)
    assert (ours.rope_theta, ours.rope_scaling.rope_type) == (rope["rope_theta"], rope["rope_type"])
    assert ours.rotated_dims == int(head_dim * rope["partial_rotary_factor"]) and not ours.rope_interleaved


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(n_shared_experts=0), "n_shared_experts 0 must be >= 1"),
        (dict(n_group=3), "n_group 3 must divide the 128 routed experts"),
        (dict(n_group=8, topk_group=1, num_experts_per_tok=20), "num_experts_per_tok 20 is more than the 16 experts"),
        (dict(rope_scaling=dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0])), "'longrope' is read"),
        (dict(layer_types=["sliding_attention"] * 4, sliding_window=4), "not supported for Glm4MoeForCausalLM"),
    ],
)
def test_glm4_moe_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**GLM4_MOE, **fields, "architectures": ["Glm4MoeForCausalLM"]})


MINIMAX_M2 = dict(vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=2, num_attention_heads=8)
# MiniMax-M2's config.json as released (transformers 4's layout): rotary_dim and rope_theta at the top, and fields
# transformers' MiniMaxM2 does not read (its one way of running them), MTP modules stored after the decoder's layers
MINIMAX_M2_RELEASED = dict(head_dim=8, num_key_value_heads=2, rotary_dim=4, rope_theta=5e6, attn_type_list=[1, 1],
                           use_qk_norm=True, qk_norm_type="per_layer", scoring_func="sigmoid", use_routing_bias=True,
                           shared_intermediate_size=0, num_mtp_modules=3, use_mtp=True, num_local_experts=16,
                           num_experts_per_tok=4, rms_norm_eps=1e-5)


@pytest.mark.parametrize("fields", [
    {}, MINIMAX_M2_RELEASED,
    dict(head_dim=8, rotary_dim=4, partial_rotary_factor=0.25),  # the factor wins over the legacy rotary_dim
    dict(head_dim=8, rotary_dim=4, rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                                       partial_rotary_factor=1.0)),
])
def test_minimax_m2_fields_read_as_transformers_reads_them(fields):
    ours = from_hf_config({**MINIMAX_M2, **fields, "architectures": ["MiniMaxM2ForCausalLM"]})
    theirs = transformers.MiniMaxM2Config(**MINIMAX_M2, **fields)
    rope = theirs.rope_parameters
    if "rotary_dim" in fields and "partial_rotary_factor" not in rope:
        pytest.skip(f"transformers {transformers.__version__}'s MiniMaxM2Config ignores the released rotary_dim "
                    "(it rotates every head dim)")
    assert (ours.num_kv_heads, ours.head_dim, ours.rotated_dims) == (
        theirs.num_key_value_heads, theirs.head_dim, int(theirs.head_dim * rope.get("partial_rotary_factor", 1.0)))
    assert (ours.rope_theta, ours.rope_scaling.rope_type, ours.rope_interleaved) == (
        rope["rope_theta"], "default", False)
    assert (ours.num_experts, ours.experts_per_token, ours.moe_intermediate_size) == (
        theirs.num_local_experts, theirs.num_experts_per_tok, theirs.intermediate_size)
    assert (ours.norm_topk_prob, ours.expert_groups, ours.routed_scaling_factor, ours.shared_expert_intermediate_size) \
        == (True, 1, 1.0, 0)
    assert (ours.qk_norm, ours.qk_norm_whole, ours.qkv_bias, ours.dense_layers) == (True, True, False, ())
    assert (ours.rms_norm_eps, ours.max_position_embeddings, ours.tie_word_embeddings, ours.eos_token_ids) == (
        theirs.rms_norm_eps, theirs.max_position_embeddings, theirs.tie_word_embeddings, (theirs.eos_token_id,))
    assert ours.mtp_layers == fields.get("num_mtp_modules", 0)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(scoring_func="softmax"), "scoring_func 'softmax' is not supported .* 'sigmoid' only"),
        (dict(use_qk_norm=False), "use_qk_norm False is not supported"),
        (dict(qk_norm_type="per_head"), "qk_norm_type 'per_head' is not supported .* 'per_layer' only"),
        (dict(use_routing_bias=False), "use_routing_bias False is not supported"),
        (dict(shared_intermediate_size=64), "shared_intermediate_size 64 is not supported"),
        (dict(attn_type_list=[0, 1]), r"attn_type_list \[0, 1\] is not supported .* lightning attention"),
        (dict(head_dim=8, rotary_dim=3), "partial_rotary_factor 0.375 must be in"),
    ],
)
def test_minimax_m2_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**MINIMAX_M2, **fields, "architectures": ["MiniMaxM2ForCausalLM"]})


DEEPSEEK = dict(vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=4, num_attention_heads=2,
                num_experts_per_tok=2)  # DeepseekV2Config has no default for it
DEEPSEEK_V2, DEEPSEEK_V3 = "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"
DEEPSEEK_LAYOUTS = [
    {},
    dict(q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=8, v_head_dim=24, n_routed_experts=8,
         n_shared_experts=2, moe_intermediate_size=4, first_k_dense_replace=1, routed_scaling_factor=2.0,
         num_nextn_predict_layers=2, rope_interleave=False, n_group=2, topk_group=1, norm_topk_prob=False),
    # DeepSeek-V2-Lite's rope (transformers 4's layout): YaRN whose mscale_all_dim also scales the softmax
    dict(rope_scaling=dict(type="yarn", factor=40, mscale=0.707, mscale_all_dim=0.707, beta_fast=32, beta_slow=1,
                           original_max_position_embeddings=4096), rope_theta=10000, max_position_embeddings=163840),
    # DeepSeek-V3's (transformers 5's layout); a linear rope with mscale_all_dim (transformers scales any but default)
    dict(rope_parameters=dict(rope_type="yarn", factor=40.0, mscale=1.0, mscale_all_dim=1.0, rope_theta=10000.0,
                              original_max_position_embeddings=4096), max_position_embeddings=163840),
    dict(rope_parameters=dict(rope_type="linear", factor=2.0, mscale_all_dim=0.5, rope_theta=500.0)),
]


@pytest.mark.parametrize("arch", [DEEPSEEK_V2, DEEPSEEK_V3])
@pytest.mark.parametrize("fields", DEEPSEEK_LAYOUTS)
def test_deepseek_fields_a_config_leaves_out_read_as_transformers_reads_them(arch, fields):
    ours = from_hf_config({**DEEPSEEK, **fields, "architectures": [arch]})
    theirs = getattr(transformers, arch).config_class(**DEEPSEEK, **fields)
    modeling = getattr(transformers.models, theirs.model_type)
    mla, rope = ours.latent_attention, theirs.rope_parameters
    assert (mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.q_lora_rank or None) == (
        theirs.kv_lora_rank, theirs.qk_nope_head_dim, theirs.qk_rope_head_dim, theirs.v_head_dim, theirs.q_lora_rank)
    # One cached row of the latent and the rotated key part; rope on those dims only
    assert (ours.num_kv_heads, ours.head_dim, ours.rotated_dims) == (
        1, theirs.kv_lora_rank + theirs.qk_rope_head_dim, theirs.qk_rope_head_dim)
    scaling = getattr(modeling, f"modeling_{theirs.model_type}").yarn_apply_mscale(rope, theirs.qk_head_dim**-0.5)
    assert ours.attn_scale == pytest.approx(scaling, rel=1e-12)
    assert ours.rope_interleaved == (arch == DEEPSEEK_V2 or theirs.rope_interleave)
    assert (ours.rope_theta, ours.rope_scaling.rope_type) == (rope["rope_theta"], rope["rope_type"])
    assert (ours.num_experts, ours.experts_per_token, ours.moe_intermediate_size) == (
        theirs.n_routed_experts, theirs.num_experts_per_tok, theirs.moe_intermediate_size)
    assert ours.shared_expert_intermediate_size == theirs.n_shared_experts * theirs.moe_intermediate_size
    assert (ours.dense_layers, ours.routed_scaling_factor) == (
        tuple(range(theirs.first_k_dense_replace)), theirs.routed_scaling_factor)
    if arch == DEEPSEEK_V3:
        assert (ours.expert_groups, ours.expert_groups_per_token, ours.norm_topk_prob, ours.mtp_layers) == (
            theirs.n_group, theirs.topk_group, theirs.norm_topk_prob, theirs.num_mtp_layers)
    else:  # greedy: every expert open; the weights never renormalised
        assert (ours.expert_groups, ours.expert_groups_per_token, ours.norm_topk_prob) == (1, 1, False)
    assert (ours.rms_norm_eps, ours.max_position_embeddings, ours.tie_word_embeddings, ours.activation) == (
        theirs.rms_norm_eps, theirs.max_position_embeddings, theirs.tie_word_embeddings, theirs.hidden_act)
    assert (ours.bos_token_id, ours.eos_token_ids) == (theirs.bos_token_id, (theirs.eos_token_id,))


def test_deepseek_v2_group_limited_greedy_reads_its_groups():
    cfg = from_hf_config({**DEEPSEEK, "architectures": [DEEPSEEK_V2], "topk_method": "group_limited_greedy",
                          "n_group": 8, "topk_group": 3, "n_routed_experts": 160})
    assert (cfg.expert_groups, cfg.expert_groups_per_token, cfg.num_experts) == (8, 3, 160)


@pytest.mark.parametrize(
    "arch,fields,message",
    [
        (DEEPSEEK_V2, dict(attention_bias=True), "attention_bias=True is not supported"),
        (DEEPSEEK_V2, dict(topk_method="noaux_tc"), "'noaux_tc' with scoring_func 'softmax' is not supported for"),
        (DEEPSEEK_V3, dict(topk_method="greedy"), "topk_method 'greedy' .* not supported for DeepseekV3ForCausalLM"),
        (DEEPSEEK_V3, dict(scoring_func="softmax"), "scoring_func 'softmax' is not supported"),
        (DEEPSEEK_V3, dict(moe_layer_freq=2), "moe_layer_freq 2 is not supported"),
        (DEEPSEEK_V2, dict(norm_topk_prob=True), "norm_topk_prob=True is not supported for DeepseekV2ForCausalLM"),
        (DEEPSEEK_V3, dict(n_shared_experts=0), "n_shared_experts 0 must be >= 1"),
        (DEEPSEEK_V2, dict(topk_method="group_limited_greedy"), "group_limited_greedy needs n_group and topk_group"),
        (DEEPSEEK_V2, dict(topk_method="group_limited_greedy", n_group=3, topk_group=1),
         "n_group 3 must divide the 64 routed experts"),
        (DEEPSEEK_V3, dict(n_group=3), "n_group 3 must divide the 256 routed experts"),
        (DEEPSEEK_V2, dict(num_experts_per_tok=None), "no num_experts_per_tok"),
        (DEEPSEEK_V3, dict(qk_rope_head_dim=15), "rotary dims 15 must be even"),
        (DEEPSEEK_V3, dict(rope_scaling=dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0])),
         "'longrope' is read"),
    ],
)
def test_deepseek_configs_that_cannot_run_are_refused_by_name(arch, fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**DEEPSEEK, **fields, "architectures": [arch]})


LLAMA4 = dict(vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=8, num_attention_heads=8)
LLAMA4_LAYOUTS = [  # Llama4TextConfig's defaults; nulls read as transformers reads them; Maverick's interleaving
    {},
    dict(attention_chunk_size=None, no_rope_layers=None, moe_layers=None, layer_types=None),
    dict(interleave_moe_layer_step=2, use_qk_norm=False, no_rope_layers=[1, 0, 1, 1, 0, 1, 1, 1], floor_scale=4,
         attn_temperature_tuning=False, attention_bias=True, rope_theta=5.0, intermediate_size_mlp=12),
    dict(moe_layers=[1, 5], layer_types=["full_attention"] * 7 + ["chunked_attention"], attention_chunk_size=16,
         rope_scaling=dict(rope_type="llama3", factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0,
                           original_max_position_embeddings=64), num_experts_per_tok=2, num_local_experts=4),
]


@pytest.mark.parametrize("conditional", [False, True], ids=["causal", "conditional"])
@pytest.mark.parametrize("fields", LLAMA4_LAYOUTS)
def test_llama4_fields_a_config_leaves_out_read_as_transformers_reads_them(fields, conditional):
    """Llama4ForCausalLM's config, or the text_config of Llama4ForConditionalGeneration's (as Meta ships it)."""
    text = {**LLAMA4, **fields}
    hf = {"architectures": ["Llama4ForConditionalGeneration"], "text_config": text, "vision_config": {}} \
        if conditional else {**text, "architectures": ["Llama4ForCausalLM"]}
    ours, theirs = from_hf_config(hf), transformers.Llama4TextConfig(**text)
    rope = theirs.rope_parameters
    assert (ours.num_kv_heads, ours.head_dim, ours.rms_norm_eps, ours.max_position_embeddings) == (
        theirs.num_key_value_heads, theirs.head_dim, theirs.rms_norm_eps, theirs.max_position_embeddings)
    assert (ours.bos_token_id, ours.eos_token_ids, ours.tie_word_embeddings, ours.activation) == (
        theirs.bos_token_id, (theirs.eos_token_id,), theirs.tie_word_embeddings, theirs.hidden_act)
    assert (ours.rope_theta, ours.rope_scaling.rope_type, ours.rope_interleaved) == (
        rope["rope_theta"], rope["rope_type"], True)
    assert ours.nope_layers == tuple(i for i, rotary in enumerate(theirs.no_rope_layers[:8]) if not rotary)
    # a null chunk size chunks nothing (transformers 5.17 still calls such layers "chunked_attention")
    assert ours.layer_chunks == tuple((theirs.attention_chunk_size or 0) if t == "chunked_attention" else 0
                                      for t in theirs.layer_types)
    assert ours.dense_layers == tuple(i for i in range(8) if i not in theirs.moe_layers)
    assert (ours.num_experts, ours.experts_per_token, ours.moe_intermediate_size) == (
        theirs.num_local_experts, theirs.num_experts_per_tok, theirs.intermediate_size)
    assert (ours.shared_expert_intermediate_size, ours.intermediate_size) == (
        theirs.intermediate_size, theirs.intermediate_size_mlp)
    assert (ours.qk_l2_norm, ours.qkv_bias, ours.o_bias) == (theirs.use_qk_norm, theirs.attention_bias,
                                                             theirs.attention_bias)
    assert (ours.query_scale_beta, ours.query_scale_period) == (
        theirs.attn_scale if theirs.attn_temperature_tuning else 0.0, theirs.floor_scale)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(layer_types=["sliding_attention"] * 8), r"layer_types .* must list one of \['chunked_attention'"),
        (dict(attention_chunk_size=None, layer_types=["chunked_attention"] * 8),
         "attention_chunk_size None must be a positive number"),
        (dict(no_rope_layers=[1, 2] * 4), r"no_rope_layers \[1, 2, .* must give 1 \(rotary\) or 0 \(NoPE\)"),
        (dict(no_rope_layers=[1] * 9), r"no_rope_layers \[1, .* for each of the 8 layers"),
        (dict(interleave_moe_layer_step=0), "interleave_moe_layer_step 0 must be >= 1"),
        (dict(moe_layers=[8]), r"moe_layers \[8\] must be layer indices below num_hidden_layers 8"),
        (dict(floor_scale=0), "floor_scale 0 must be >= 1 with attn_temperature_tuning"),
        (dict(rope_scaling=dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0])), "'longrope' is read"),
    ],
)
def test_llama4_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**LLAMA4, **fields, "architectures": ["Llama4ForCausalLM"]})


def test_llama4_conditional_generation_without_a_text_config_is_refused_by_name():
    with pytest.raises(ConfigError, match="text_config None is not supported: a Llama4ForConditionalGeneration"):
        from_hf_config({**LLAMA4, "architectures": ["Llama4ForConditionalGeneration"]})
