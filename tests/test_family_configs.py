"""Config reading of the families beyond Llama, and the registry's errors (no model is run here)."""

from __future__ import annotations

import math

import pytest
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from jaxinfer import ConfigError, from_hf_config
from jaxinfer.models.registry import SUPPORTED_ARCHITECTURES
from jaxinfer.models.rope import attention_factor, for_context

BASE = dict(vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=6, num_attention_heads=2,
            head_dim=8)


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(ConfigError, match="'RwkvForCausalLM' is not supported; supported: LlamaForCausalLM"):
        from_hf_config({**BASE, "architectures": ["RwkvForCausalLM"]})
    with pytest.raises(ConfigError, match="Phi3SmallForCausalLM.*block-sparse attention.*supported: LlamaForCausalLM"):
        from_hf_config({**BASE, "architectures": ["Phi3SmallForCausalLM"]})
    assert {"Gemma2ForCausalLM", "Gemma3ForCausalLM", "Qwen2MoeForCausalLM", "BambaForCausalLM",
            "NemotronHForCausalLM", "FalconH1ForCausalLM", "Lfm2ForCausalLM",
            "Lfm2MoeForCausalLM"} <= set(SUPPORTED_ARCHITECTURES)


def test_gemma2_defaults_follow_transformers():
    cfg = from_hf_config({**BASE, "architectures": ["Gemma2ForCausalLM"], "sliding_window": 4})
    assert cfg.layer_windows == (4, 0, 4, 0, 4, 0)  # every other layer global, the first sliding
    assert (cfg.attn_soft_cap, cfg.final_soft_cap) == (50.0, 30.0)
    assert cfg.attn_scale == 256**-0.5 and cfg.tie_word_embeddings and cfg.norm_weight_offset == 1.0
    assert not cfg.qk_norm and cfg.local_rope_theta is None


def test_gemma3_transformers4_layout():
    cfg = from_hf_config({
        **BASE, "architectures": ["Gemma3ForCausalLM"], "sliding_window": 4, "sliding_window_pattern": 3,
        "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "query_pre_attn_scalar": 64, "final_logit_softcapping": None,
    })
    assert cfg.layer_windows == (4, 4, 0, 4, 4, 0)
    assert (cfg.rope_theta, cfg.local_rope_theta) == (1e6, 1e4)
    assert (cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == ("linear", 8.0)
    assert cfg.qk_norm and cfg.attn_soft_cap is None and cfg.final_soft_cap is None and cfg.attn_scale == 1 / 8


def test_gemma3_transformers5_rope_per_layer_type():
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}}
    cfg = from_hf_config({**BASE, "architectures": ["Gemma3ForCausalLM"], "rope_parameters": rope,
                          "layer_types": ["sliding_attention", "full_attention"] * 3})
    assert (cfg.rope_theta, cfg.local_rope_theta, cfg.rope_scaling.factor) == (500.0, 10.0, 2.0)
    assert cfg.layer_windows == (4096, 0) * 3


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
        (dict(sliding_window_pattern=0), "sliding_window_pattern 0 must be >= 1"),
        (dict(rope_parameters={"sliding_attention": {"rope_type": "linear", "factor": 2.0}}),
         "sliding layers' rope"),
    ],
)
def test_gemma3_configs_that_cannot_run_are_rejected(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**BASE, "architectures": ["Gemma3ForCausalLM"], **fields})


PHI3 = {**BASE, "architectures": ["Phi3ForCausalLM"], "max_position_embeddings": 1024,
        "original_max_position_embeddings": 256}


def test_phi3_longrope_reads_su_and_picks_factors_by_served_context():
    rope = {"type": "su", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    cfg = from_hf_config({**PHI3, "rope_scaling": rope})
    s = cfg.rope_scaling
    assert (s.rope_type, s.factor, s.original_max_position_embeddings) == ("longrope", 4.0, 256)
    assert not s.long and for_context(cfg, 256).rope_scaling == s  # within the original context: short
    assert for_context(cfg, 257).rope_scaling.long
    assert attention_factor(s) == pytest.approx((1 + math.log(4) / math.log(256)) ** 0.5)


def test_phi3_partial_rotary_factor():
    cfg = from_hf_config({**PHI3, "partial_rotary_factor": 0.5})
    assert (cfg.rotated_dims, cfg.head_dim) == (4, 8)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(rope_scaling={"type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 4}),
         "short_factor has 3 entries; LongRoPE needs one per rotated frequency: 4"),
        (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "'llama3' is not supported for Phi3ForCausalLM"),
        (dict(partial_rotary_factor=0.375), "partial_rotary_factor 0.375 must be in"),
        (dict(attention_bias=True), "attention_bias=True is not supported"),
    ],
)
def test_phi3_configs_that_cannot_run_are_rejected(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**PHI3, **fields})


def test_longrope_is_refused_outside_phi3():
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 4}
    with pytest.raises(ConfigError, match="'longrope' is read for Phi3ForCausalLM only"):
        from_hf_config({**BASE, "architectures": ["LlamaForCausalLM"], "rope_scaling": rope})


GRANITES = ["GraniteForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM"]


@pytest.mark.parametrize("architecture", GRANITES)
def test_granite_fields_a_config_leaves_out_take_transformers_defaults(architecture):
    """Every multiplier 1.0 (the softmax scale too, not head_dim ** -0.5), 2048 positions, no biases or tied
    head, bos 1 and eos 2; the MoE ones 8 experts of intermediate_size, 2 per token, and no shared MLP."""
    hf = getattr(transformers, architecture).config_class(**BASE)
    cfg = from_hf_config({**BASE, "architectures": [architecture]})
    assert (cfg.embedding_multiplier, cfg.attn_scale, cfg.residual_multiplier, cfg.logits_scaling) == (
        hf.embedding_multiplier, hf.attention_multiplier, hf.residual_multiplier, hf.logits_scaling) == (1.0,) * 4
    assert (cfg.max_position_embeddings, cfg.tie_word_embeddings, cfg.qkv_bias, cfg.o_bias) == (
        hf.max_position_embeddings, hf.tie_word_embeddings, hf.attention_bias, hf.attention_bias)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,)) == (1, (2,))
    if architecture != "GraniteForCausalLM":
        assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size) == (
            hf.num_local_experts, hf.num_experts_per_tok, hf.intermediate_size)
        assert cfg.shared_expert_intermediate_size == getattr(hf, "shared_intermediate_size", 0) == 0


def test_granite_reads_its_multipliers():
    cfg = from_hf_config({**BASE, "architectures": ["GraniteMoeSharedForCausalLM"], "embedding_multiplier": 12,
                          "attention_multiplier": 0.0078125, "residual_multiplier": 0.22, "logits_scaling": 8.0,
                          "shared_intermediate_size": 16, "attention_bias": True})
    assert (cfg.embedding_multiplier, cfg.attn_scale, cfg.residual_multiplier, cfg.logits_scaling) == (
        12.0, 0.0078125, 0.22, 8.0)
    assert cfg.shared_expert_intermediate_size == 16 and cfg.qkv_bias and cfg.o_bias


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(logits_scaling=0), "logits_scaling 0 is not supported for GraniteForCausalLM: it must be a positive"),
        (dict(attention_multiplier="0.1"), "attention_multiplier '0.1' is not supported"),
        (dict(mlp_bias=True), "mlp_bias=True is not supported for GraniteForCausalLM"),
        (dict(layer_types=["sliding_attention"] * 6), "not supported for GraniteForCausalLM"),
    ],
)
def test_granite_configs_that_cannot_run_are_rejected(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**BASE, "architectures": ["GraniteForCausalLM"], **fields})


SEED_OSS = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=2, num_attention_heads=16)
SEED_OSS_FIELDS = [
    {},  # transformers' defaults: 8 KV heads of 128 dims, q/k/v biased and o not, 524288 positions
    dict(num_key_value_heads=None, head_dim=None),  # nulls: one KV head per query head, hidden_size / heads dims
    dict(attention_bias=False, attention_out_bias=True, rope_theta=1e7,
         rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=4096)),
]


@pytest.mark.parametrize("fields", SEED_OSS_FIELDS)
def test_seed_oss_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**SEED_OSS, **fields, "architectures": ["SeedOssForCausalLM"]})
    hf = transformers.SeedOssConfig(**SEED_OSS, **fields)
    rope = hf.rope_parameters
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.qkv_bias, cfg.o_bias) == (
        hf.num_key_value_heads, hf.head_dim, hf.attention_bias, hf.attention_out_bias)
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == (
        rope["rope_theta"], rope["rope_type"], rope.get("factor", 1.0))
    assert (cfg.max_position_embeddings, cfg.rms_norm_eps, cfg.tie_word_embeddings, cfg.activation) == (
        hf.max_position_embeddings, hf.rms_norm_eps, hf.tie_word_embeddings, hf.hidden_act)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))
    assert not cfg.rope_interleaved and cfg.rotated_dims == cfg.head_dim


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(mlp_bias=True), "mlp_bias=True is not supported for SeedOssForCausalLM"),
        (dict(rope_scaling=dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0])), "'longrope' is read"),
        (dict(layer_types=["sliding_attention"] * 2, sliding_window=4), "not supported for SeedOssForCausalLM"),
    ],
)
def test_seed_oss_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**SEED_OSS, **fields, "architectures": ["SeedOssForCausalLM"]})


ERNIE = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=2, num_attention_heads=16)
ERNIE_FIELDS = [
    {},  # transformers' defaults: 2 KV heads of 128 dims, theta 500000, tied head, no biases
    dict(num_key_value_heads=None, head_dim=None),  # nulls: one KV head per query head, hidden_size / heads dims
    dict(rope_theta=1e4, tie_word_embeddings=False, rope_scaling=dict(rope_type="linear", factor=2.0)),
    dict(rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=4096)),
]


@pytest.mark.parametrize("fields", ERNIE_FIELDS)
def test_ernie4_5_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**ERNIE, **fields, "architectures": ["Ernie4_5ForCausalLM"]})
    hf = transformers.Ernie4_5Config(**ERNIE, **fields)
    _check_ernie_attention(cfg, hf, hf.head_dim)
    assert cfg.num_experts == 0


def _check_ernie_attention(cfg, hf, head_dim: int) -> None:
    """Both ERNIE 4.5 architectures: shapes, rope (every dim, adjacent pairs), head, token ids as transformers."""
    rope = hf.rope_parameters
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.qkv_bias, cfg.o_bias, cfg.qk_norm) == (
        hf.num_key_value_heads, head_dim, False, False, False)
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == (
        rope["rope_theta"], rope["rope_type"], rope.get("factor", 1.0))
    assert cfg.rope_interleaved and cfg.rotated_dims == cfg.head_dim
    assert (cfg.max_position_embeddings, cfg.rms_norm_eps, cfg.tie_word_embeddings, cfg.activation) == (
        hf.max_position_embeddings, hf.rms_norm_eps, hf.tie_word_embeddings, hf.hidden_act)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))


ERNIE_MOE = dict(vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=8, num_attention_heads=4,
                 moe_intermediate_size=4)
ERNIE_MOE_FIELDS = [
    {},  # transformers' defaults: 64 experts, 6 per token, 2 shared; every layer from 1 on MoE
    dict(moe_layer_start_index=2, moe_layer_interval=2, moe_layer_end_index=5, moe_num_shared_experts=0),
    dict(num_experts=8, num_experts_per_tok=3, moe_layer_start_index=0, moe_layer_interval=3, head_dim=8,
         rope_theta=1e4, num_nextn_predict_layers=1),  # transformers' aliases; MTP layers
]


@pytest.mark.parametrize("fields", ERNIE_MOE_FIELDS)
def test_ernie4_5_moe_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    """Routing and shared experts as Ernie4_5_MoeConfig reads them; MoE layers where transformers builds them."""
    cfg = from_hf_config({**ERNIE_MOE, **fields, "architectures": ["Ernie4_5_MoeForCausalLM"]})
    hf = transformers.Ernie4_5_MoeConfig(**ERNIE_MOE, **fields)
    _check_ernie_attention(cfg, hf, getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads))
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (
        hf.moe_num_experts, hf.moe_k, hf.moe_intermediate_size, True)
    assert cfg.shared_expert_intermediate_size == hf.moe_num_shared_experts * hf.moe_intermediate_size
    assert cfg.mtp_layers == getattr(hf, "num_nextn_predict_layers", 0)
    modeling = transformers.models.ernie4_5_moe.modeling_ernie4_5_moe
    model = modeling.Ernie4_5_MoeModel(hf)
    sparse = [isinstance(layer.mlp, modeling.Ernie4_5_MoeSparseMoeBlock) for layer in model.layers]
    assert [cfg.is_moe_layer(i) for i in range(cfg.num_layers)] == sparse and any(sparse) and not all(sparse)


@pytest.mark.parametrize(
    "architecture,fields,message",
    [
        ("Ernie4_5ForCausalLM", dict(use_bias=True), "use_bias=True is not supported for Ernie4_5ForCausalLM"),
        ("Ernie4_5_MoeForCausalLM", dict(use_bias=True), "use_bias=True is not supported for Ernie4_5_MoeForCausalLM"),
        ("Ernie4_5ForCausalLM", dict(rope_scaling=dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0])),
         "'longrope' is read"),
        ("Ernie4_5ForCausalLM", dict(layer_types=["sliding_attention"] * 2, sliding_window=4),
         "not supported for Ernie4_5ForCausalLM"),
        ("Ernie4_5_MoeForCausalLM", dict(moe_k=[6, 8], moe_num_experts=[64, 64]), r"moe_k \[6, 8\] is not supported"),
        ("Ernie4_5_MoeForCausalLM", dict(moe_norm_min=1e-6), "moe_norm_min 1e-06 is not supported"),
        ("Ernie4_5_MoeForCausalLM", dict(moe_layer_interval=0), "moe_layer_interval 0 must be >= 1"),
        ("Ernie4_5_MoeForCausalLM", dict(moe_num_shared_experts=-1), "moe_num_shared_experts -1 must be >= 0"),
        ("Ernie4_5_MoeForCausalLM", dict(moe_k=9, moe_num_experts=8), "moe_k 9 must be between 1 and the 8 experts"),
    ],
)
def test_ernie4_5_configs_that_cannot_run_are_refused_by_name(architecture, fields, message):
    base = ERNIE if architecture == "Ernie4_5ForCausalLM" else ERNIE_MOE
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**base, **fields, "architectures": [architecture]})


EXAONE = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=6, num_attention_heads=32)
EXAONE_FIELDS = [
    {},  # transformers' defaults: every 4th layer full, the others sliding over 4096; 32 KV heads; 2048 positions
    dict(sliding_window=16, sliding_window_pattern=3, num_key_value_heads=8, head_dim=16,
         rope_parameters=dict(rope_type="llama3", rope_theta=1e6, factor=16.0, low_freq_factor=1.0,
                              high_freq_factor=4.0, original_max_position_embeddings=64)),
    dict(sliding_window=8, layer_types=["full_attention", "sliding_attention"] * 3, rope_theta=5e5),
    dict(sliding_window=None, layer_types=["full_attention"] * 6),  # EXAONE-4.0-1.2B: no window, rope everywhere
]


@pytest.mark.parametrize("fields", EXAONE_FIELDS)
def test_exaone4_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    """Windows on the layers Exaone4Config marks sliding; rotary embeddings where Exaone4Attention applies them
    (every layer without a window, else the sliding ones only)."""
    cfg = from_hf_config({**EXAONE, **fields, "architectures": ["Exaone4ForCausalLM"]})
    hf = transformers.Exaone4Config(**EXAONE, **fields)
    sliding = [t == "sliding_attention" for t in hf.layer_types]
    assert cfg.layer_windows == tuple(hf.sliding_window if s else 0 for s in sliding)
    rotated = [hf.sliding_window is None or s for s in sliding]
    assert cfg.nope_layers == tuple(i for i, r in enumerate(rotated) if not r)
    rope = hf.rope_parameters
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == (
        rope["rope_theta"], rope["rope_type"], rope.get("factor", 1.0))
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.qkv_bias, cfg.o_bias, cfg.qk_norm, cfg.qk_norm_whole) == (
        hf.num_key_value_heads, getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads), False, False,
        True, False)
    assert (cfg.max_position_embeddings, cfg.rms_norm_eps, cfg.tie_word_embeddings, cfg.activation) == (
        hf.max_position_embeddings, hf.rms_norm_eps, hf.tie_word_embeddings, hf.hidden_act)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))


def test_exaone4_null_window_without_layer_types_is_full_attention_with_rope():
    """transformers divides by the pattern a null window zeroes (an error); the attention it describes is this."""
    cfg = from_hf_config({**EXAONE, "sliding_window": None, "architectures": ["Exaone4ForCausalLM"]})
    assert cfg.layer_windows == (0,) * 6 and cfg.nope_layers == ()


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(sliding_window_pattern="LLLG"), "sliding_window_pattern 'LLLG' is not supported without layer_types"),
        (dict(sliding_window_pattern=0), "sliding_window_pattern 0 is not supported without layer_types"),
        (dict(sliding_window=None, layer_types=["sliding_attention"] * 6), "sliding layers but sliding_window is null"),
        (dict(sliding_window=0), "sliding_window 0 must be >= 1"),
        (dict(layer_types=["sliding_attention"] * 5), "layer_types .* for each of the 6 layers"),
        (dict(rope_scaling=dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0])), "'longrope' is read"),
        (dict(mlp_bias=True), "mlp_bias=True is not supported for Exaone4ForCausalLM"),
    ],
)
def test_exaone4_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**EXAONE, **fields, "architectures": ["Exaone4ForCausalLM"]})


MINISTRAL3 = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=2, num_attention_heads=32)
MINISTRAL3_FIELDS = [
    {},  # transformers' defaults: YaRN x16 over 16384 positions, beta 0.1; head_dim 128, 8 KV heads; no window
    dict(head_dim=16, num_key_value_heads=4, sliding_window=32, rope_theta=5e5),  # a bare rope_theta is ignored
    dict(rope_parameters=dict(rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=64,
                              llama_4_scaling_beta=0.5), max_position_embeddings=256),
]


@pytest.mark.parametrize("fields", MINISTRAL3_FIELDS)
def test_ministral3_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    """Shapes, window, YaRN and the query scaling Ministral3Attention reads from its rope parameters."""
    cfg = from_hf_config({**MINISTRAL3, **fields, "architectures": ["Ministral3ForCausalLM"]})
    hf = transformers.Ministral3Config(**MINISTRAL3, **fields)
    rope = hf.rope_parameters
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == (
        rope["rope_theta"], rope["rope_type"], rope["factor"])
    assert cfg.rope_scaling.original_max_position_embeddings == rope["original_max_position_embeddings"]
    _, hf_factor = ROPE_INIT_FUNCTIONS["yarn"](hf)  # 1 from mscale / mscale_all_dim; factor 4's own without them
    assert attention_factor(cfg.rope_scaling) == pytest.approx(hf_factor)
    assert (cfg.query_scale_beta, cfg.query_scale_period) == (
        rope["llama_4_scaling_beta"], rope["original_max_position_embeddings"])
    assert cfg.layer_windows == (hf.sliding_window or 0,) * 2
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.qkv_bias, cfg.o_bias, cfg.qk_norm) == (
        hf.num_key_value_heads, hf.head_dim, False, False, False)
    assert (cfg.max_position_embeddings, cfg.rms_norm_eps, cfg.tie_word_embeddings, cfg.activation) == (
        hf.max_position_embeddings, hf.rms_norm_eps, hf.tie_word_embeddings, hf.hidden_act)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(rope_parameters=dict(rope_type="yarn", rope_theta=1e6, factor=4.0)),
         "llama_4_scaling_beta None is not supported"),
        (dict(rope_parameters=dict(rope_type="default", rope_theta=1e6, llama_4_scaling_beta=0.1)),
         "rope type 'default' is not supported for Ministral3ForCausalLM"),
        (dict(layer_types=["sliding_attention", "full_attention"], sliding_window=4), "not supported for Ministral3"),
    ],
)
def test_ministral3_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**MINISTRAL3, **fields, "architectures": ["Ministral3ForCausalLM"]})


def test_mistral3_vision_model_runs_its_ministral3_text_config():
    """Mistral3ForConditionalGeneration (Ministral 3's vision model) reads its text_config's Ministral 3 config (its
    Pixtral tower: tests/test_pixtral.py)."""
    vision = {"architectures": ["Mistral3ForConditionalGeneration"], "text_config": {**MINISTRAL3,
                                                                                  "model_type": "ministral3"}}
    assert from_hf_config(vision) == from_hf_config({**MINISTRAL3, "architectures": ["Ministral3ForCausalLM"]})


COHERE2 = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=6, num_attention_heads=4)
COHERE2_FIELDS = [
    {},  # transformers' defaults: every 4th layer full, the others sliding over 4096; logits x 0.0625; tied head
    dict(sliding_window=16, sliding_window_pattern=3, num_key_value_heads=2, logit_scale=0.25, attention_bias=True,
         layer_norm_eps=1e-6, rope_theta=5e4, tie_word_embeddings=False),
    dict(sliding_window=8, layer_types=["full_attention", "sliding_attention"] * 3, head_dim=32),
]


@pytest.mark.parametrize("fields", COHERE2_FIELDS)
def test_cohere2_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    """Windows and rotary embeddings on the layers Cohere2Config marks sliding (none on the full ones), LayerNorm,
    the logit scale, biases and the tied head as transformers reads them."""
    cfg = from_hf_config({**COHERE2, **fields, "architectures": ["Cohere2ForCausalLM"]})
    hf = transformers.Cohere2Config(**COHERE2, **fields)
    sliding = [t == "sliding_attention" for t in hf.layer_types]
    assert cfg.layer_windows == tuple(hf.sliding_window if s else 0 for s in sliding)
    assert cfg.nope_layers == tuple(i for i, s in enumerate(sliding) if not s)
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_interleaved) == (
        hf.rope_parameters["rope_theta"], hf.rope_parameters["rope_type"], True)
    assert (cfg.layer_norm, cfg.rms_norm_eps, cfg.logits_scaling) == (True, hf.layer_norm_eps, 1 / hf.logit_scale)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.qkv_bias, cfg.o_bias, cfg.qk_norm) == (
        hf.num_key_value_heads, hf.head_dim, hf.attention_bias, hf.attention_bias, False)
    assert (cfg.max_position_embeddings, cfg.tie_word_embeddings, cfg.activation) == (
        hf.max_position_embeddings, hf.tie_word_embeddings, hf.hidden_act)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(sliding_window=None), "sliding_window None is not supported for Cohere2ForCausalLM"),
        (dict(logit_scale=0), "logit_scale 0 is not supported for Cohere2ForCausalLM"),
        (dict(sliding_window_pattern="LLLG"), "sliding_window_pattern 'LLLG' is not supported without layer_types"),
        (dict(layer_types=["sliding_attention"] * 5), "layer_types .* for each of the 6 layers"),
        (dict(mlp_bias=True), "mlp_bias=True is not supported for Cohere2ForCausalLM"),
    ],
)
def test_cohere2_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**COHERE2, **fields, "architectures": ["Cohere2ForCausalLM"]})


APERTUS = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=2, num_attention_heads=4)
APERTUS_FIELDS = [
    {},  # transformers' defaults: Llama 3 rope x8 over 8192 positions, theta 1.2e7; 65536 positions; untied
    dict(num_key_value_heads=2, head_dim=32, attention_bias=True, rms_norm_eps=1e-6, tie_word_embeddings=True,
         rope_parameters=dict(rope_type="default", rope_theta=5e5)),
]


@pytest.mark.parametrize("fields", APERTUS_FIELDS)
def test_apertus_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**APERTUS, **fields, "architectures": ["ApertusForCausalLM"]})
    hf = transformers.ApertusConfig(**APERTUS, **fields)
    rope = hf.rope_parameters
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == (
        rope["rope_theta"], rope["rope_type"], rope.get("factor", 1.0))
    if rope["rope_type"] == "llama3":
        assert cfg.rope_scaling.original_max_position_embeddings == rope["original_max_position_embeddings"]
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.qkv_bias, cfg.o_bias, cfg.qk_norm, cfg.activation) == (
        hf.num_key_value_heads, getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads),
        hf.attention_bias, hf.attention_bias, True, hf.hidden_act)
    assert (cfg.max_position_embeddings, cfg.rms_norm_eps, cfg.tie_word_embeddings) == (
        hf.max_position_embeddings, hf.rms_norm_eps, hf.tie_word_embeddings)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(hidden_act="silu"), "hidden_act 'silu' is not supported for ApertusForCausalLM"),
        (dict(mlp_bias=True), "mlp_bias=True is not supported for ApertusForCausalLM"),
        (dict(layer_types=["sliding_attention"] * 2, sliding_window=4), "not supported for ApertusForCausalLM"),
    ],
)
def test_apertus_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**APERTUS, **fields, "architectures": ["ApertusForCausalLM"]})


ARCEE = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=2, num_attention_heads=4)
ARCEE_FIELDS = [
    {},  # transformers' defaults: relu2, rms_norm_eps 1e-5, theta 10000, 4096 positions, untied, no biases
    dict(num_key_value_heads=2, head_dim=32, attention_bias=True, tie_word_embeddings=True,
         rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=20.0, original_max_position_embeddings=64)),
]


@pytest.mark.parametrize("fields", ARCEE_FIELDS)
def test_arcee_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    cfg = from_hf_config({**ARCEE, **fields, "architectures": ["ArceeForCausalLM"]})
    hf = transformers.ArceeConfig(**ARCEE, **fields)
    rope = hf.rope_parameters
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == (
        rope["rope_theta"], rope["rope_type"], rope.get("factor", 1.0))
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.qkv_bias, cfg.o_bias, cfg.qk_norm, cfg.activation) == (
        hf.num_key_value_heads, hf.head_dim, hf.attention_bias, hf.attention_bias, False, hf.hidden_act)
    assert (cfg.max_position_embeddings, cfg.rms_norm_eps, cfg.tie_word_embeddings) == (
        hf.max_position_embeddings, hf.rms_norm_eps, hf.tie_word_embeddings)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(hidden_act="relu"), "activation 'relu' is not supported"),
        (dict(mlp_bias=True), "mlp_bias=True is not supported for ArceeForCausalLM"),
        (dict(layer_types=["sliding_attention"] * 2, sliding_window=4), "not supported for ArceeForCausalLM"),
    ],
)
def test_arcee_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**ARCEE, **fields, "architectures": ["ArceeForCausalLM"]})


OLMOE = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=2, num_attention_heads=4)
OLMOE_FIELDS = [
    {},  # transformers' defaults: 64 experts, 8 per token, not renormalised; rms_norm_eps 1e-5; untied; no biases
    dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, num_key_value_heads=2, attention_bias=True,
         rope_theta=5e5, tie_word_embeddings=True),
    dict(num_local_experts=16, rope_parameters=dict(rope_type="linear", rope_theta=1e4, factor=2.0)),  # the alias
]


@pytest.mark.parametrize("fields", OLMOE_FIELDS)
def test_olmoe_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    """Routing, q/k norms over all heads, biases and rope as OlmoeConfig reads them."""
    cfg = from_hf_config({**OLMOE, **fields, "architectures": ["OlmoeForCausalLM"]})
    hf = transformers.OlmoeConfig(**OLMOE, **fields)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (
        hf.num_experts, hf.num_experts_per_tok, hf.intermediate_size, hf.norm_topk_prob)
    assert cfg.dense_layers == () and cfg.is_moe_layer(0) and cfg.is_moe_layer(1)
    rope = hf.rope_parameters
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == (
        rope["rope_theta"], rope["rope_type"], rope.get("factor", 1.0))
    assert (cfg.num_kv_heads, cfg.qkv_bias, cfg.o_bias, cfg.qk_norm, cfg.qk_norm_whole, cfg.activation) == (
        hf.num_key_value_heads, hf.attention_bias, hf.attention_bias, True, True, hf.hidden_act)
    assert (cfg.max_position_embeddings, cfg.rms_norm_eps, cfg.tie_word_embeddings) == (
        hf.max_position_embeddings, hf.rms_norm_eps, hf.tie_word_embeddings)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(clip_qkv=8.0), "clip_qkv 8.0 is not supported for OlmoeForCausalLM"),
        (dict(head_dim=32), "head_dim 32 is not supported for OlmoeForCausalLM.*16"),
        (dict(num_experts_per_tok=9, num_experts=8), "num_experts_per_tok 9 must be between 1 and the 8 experts"),
        (dict(layer_types=["sliding_attention"] * 2, sliding_window=4), "not supported for OlmoeForCausalLM"),
    ],
)
def test_olmoe_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**OLMOE, **fields, "architectures": ["OlmoeForCausalLM"]})


COHERE = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=2, num_attention_heads=4)
COHERE_FIELDS = [
    {},  # transformers' defaults: theta 500000, logits x 0.0625, layer_norm_eps 1e-5, tied head, no q/k norms
    dict(use_qk_norm=True, num_key_value_heads=2, logit_scale=0.125, attention_bias=True, layer_norm_eps=1e-6,
         tie_word_embeddings=False, rope_parameters=dict(rope_type="linear", rope_theta=8e6, factor=2.0)),
]


@pytest.mark.parametrize("fields", COHERE_FIELDS)
def test_cohere_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    """Rope in adjacent pairs in every layer (no window), LayerNorm, q/k norms, the logit scale, biases and the tied
    head as CohereConfig reads them."""
    cfg = from_hf_config({**COHERE, **fields, "architectures": ["CohereForCausalLM"]})
    hf = transformers.CohereConfig(**COHERE, **fields)
    rope = hf.rope_parameters
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_scaling.factor, cfg.rope_interleaved) == (
        rope["rope_theta"], rope["rope_type"], rope.get("factor", 1.0), True)
    assert cfg.layer_windows == (0, 0) and cfg.nope_layers == ()
    assert (cfg.layer_norm, cfg.rms_norm_eps, cfg.logits_scaling, cfg.qk_norm) == (
        True, hf.layer_norm_eps, 1 / hf.logit_scale, hf.use_qk_norm)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.qkv_bias, cfg.o_bias) == (
        hf.num_key_value_heads, hf.hidden_size // hf.num_attention_heads, hf.attention_bias, hf.attention_bias)
    assert (cfg.max_position_embeddings, cfg.tie_word_embeddings, cfg.activation) == (
        hf.max_position_embeddings, hf.tie_word_embeddings, hf.hidden_act)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(logit_scale=None), "logit_scale None is not supported for CohereForCausalLM"),
        (dict(layer_types=["sliding_attention"] * 2, sliding_window=4), "not supported for CohereForCausalLM"),
        (dict(mlp_bias=True), "mlp_bias=True is not supported for CohereForCausalLM"),
    ],
)
def test_cohere_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**COHERE, **fields, "architectures": ["CohereForCausalLM"]})


NEMOTRON = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=2, num_attention_heads=4)
NEMOTRON_FIELDS = [
    {},  # transformers' defaults: relu2, norm_eps 1e-5, half of each head rotated, theta 10000, untied, no biases
    dict(num_key_value_heads=2, head_dim=32, partial_rotary_factor=0.25, attention_bias=True, norm_eps=1e-6,
         rope_theta=5e5, tie_word_embeddings=True),
    dict(rope_parameters=dict(rope_type="linear", rope_theta=1e4, factor=2.0)),  # rope parameters without the factor
]


@pytest.mark.parametrize("fields", NEMOTRON_FIELDS)
def test_nemotron_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    """LayerNorm1P (offset weight, bias), partial rotary and biases as NemotronConfig reads them."""
    cfg = from_hf_config({**NEMOTRON, **fields, "architectures": ["NemotronForCausalLM"]})
    hf = transformers.NemotronConfig(**NEMOTRON, **fields)
    rope = hf.rope_parameters
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == (
        rope["rope_theta"], rope["rope_type"], rope.get("factor", 1.0))
    assert cfg.rotated_dims == int(hf.head_dim * rope["partial_rotary_factor"]) < cfg.head_dim == hf.head_dim
    assert (cfg.layer_norm, cfg.norm_bias, cfg.norm_weight_offset, cfg.rms_norm_eps) == (True, True, 1.0, hf.norm_eps)
    # NemotronConfig keeps a missing num_key_value_heads None (its attention then fails): one per query head here.
    assert (cfg.num_kv_heads, cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias, cfg.activation) == (
        hf.num_key_value_heads or hf.num_attention_heads, hf.attention_bias, hf.attention_bias, False, hf.hidden_act)
    assert (cfg.max_position_embeddings, cfg.tie_word_embeddings) == (hf.max_position_embeddings, hf.tie_word_embeddings)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(partial_rotary_factor=0.4375), "partial_rotary_factor 0.4375 must be in .* turns 7"),
        (dict(mlp_bias=True), "mlp_bias=True is not supported for NemotronForCausalLM"),
        (dict(hidden_act="relu"), "activation 'relu' is not supported"),
        (dict(layer_types=["sliding_attention"] * 2, sliding_window=4), "not supported for NemotronForCausalLM"),
    ],
)
def test_nemotron_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**NEMOTRON, **fields, "architectures": ["NemotronForCausalLM"]})


STARCODER2 = dict(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=2, num_attention_heads=4)
STARCODER2_FIELDS = [
    {},  # transformers' defaults: 2 KV heads, every projection biased, gelu-tanh, norm_epsilon 1e-5, no window, tied
    dict(use_bias=False, num_key_value_heads=4, sliding_window=32, norm_epsilon=1e-6, hidden_act="gelu",
         tie_word_embeddings=False, rope_theta=1e6),
]


@pytest.mark.parametrize("fields", STARCODER2_FIELDS)
def test_starcoder2_fields_a_config_leaves_out_read_as_transformers_reads_them(fields):
    """Biased LayerNorms, use_bias on every projection, the window and the tied head as Starcoder2Config reads them."""
    cfg = from_hf_config({**STARCODER2, **fields, "architectures": ["Starcoder2ForCausalLM"]})
    hf = transformers.Starcoder2Config(**STARCODER2, **fields)
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type) == (hf.rope_parameters["rope_theta"], "default")
    assert cfg.layer_windows == (hf.sliding_window or 0,) * 2
    assert (cfg.layer_norm, cfg.norm_bias, cfg.norm_weight_offset) == (True, True, 0.0)
    assert (cfg.rms_norm_eps, cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) == (hf.norm_epsilon, *(hf.use_bias,) * 3)
    assert (cfg.num_kv_heads, cfg.head_dim) == (hf.num_key_value_heads, hf.hidden_size // hf.num_attention_heads)
    assert cfg.activation == ("gelu_tanh" if hf.hidden_act == "gelu_pytorch_tanh" else hf.hidden_act)
    assert (cfg.max_position_embeddings, cfg.tie_word_embeddings) == (hf.max_position_embeddings, hf.tie_word_embeddings)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(hidden_act="relu"), "activation 'relu' is not supported"),
        (dict(layer_types=["full_attention"] * 2, sliding_window=4), "not supported for Starcoder2ForCausalLM"),
        (dict(rope_scaling=dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0])), "'longrope' is read"),
    ],
)
def test_starcoder2_configs_that_cannot_run_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**STARCODER2, **fields, "architectures": ["Starcoder2ForCausalLM"]})
