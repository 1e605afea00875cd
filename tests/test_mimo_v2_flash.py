"""MiMo-V2-Flash's config as transformers reads it (test_hf_parity checks its logits and greedy tokens against HF's):
which layers slide, with how many kv heads, rope and window; what is not run is refused by name; the MTP module's
tensors are skipped."""

from __future__ import annotations

import pytest

from jaxinfer.checkpoint.hf_names import in_mtp_layer
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import from_hf_config

HF = dict(architectures=["MiMoV2FlashForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
          num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2, head_dim=32, v_head_dim=16,
          n_routed_experts=8, moe_intermediate_size=32)


def test_fields_read_as_transformers_reads_them():
    """Defaults: full attention on layer 0 and every 6th, dense MLP on layer 0, sliding layers with twice the kv
    heads, the released thetas, 0.334 of each head rotated; `sliding_window_size` counts the keys before the query."""
    cfg = from_hf_config({**HF, "sliding_window_size": 128})
    assert cfg.layer_windows == (0, 129, 129, 129, 129, 0, 129)
    assert cfg.layer_kv_heads == (2, 4, 4, 4, 4, 2, 4)
    assert cfg.dense_layers == (0,)
    assert (cfg.rope_theta, cfg.local_rope_theta, cfg.rotary_dim) == (5e6, 1e4, 10)
    assert (cfg.v_head_dim, cfg.value_scale) == (16, 0.707)
    assert from_hf_config(HF).layer_windows[1] == 129  # MiMoV2FlashConfig's sliding_window
    assert in_mtp_layer(cfg, "model.mtp.layers.0.self_attn.q_proj.weight")


def test_the_released_configs_spelling_reads_the_same():
    """The remote code's keys (config.json as released): 0/1 layer lists, swa_* shapes and theta, the top-level
    partial_rotary_factor, layernorm_epsilon; a null attention_value_scale is 1, as the modeling code falls back."""
    hub = dict(HF, hybrid_layer_pattern=[0, 1, 1, 0, 1, 1, 1], moe_layer_freq=[0, 0, 1, 1, 1, 1, 1],
               swa_num_attention_heads=4, swa_num_key_value_heads=8, swa_head_dim=32, swa_v_head_dim=16,
               sliding_window_size=128, sliding_window=128, rope_theta=2e6, swa_rope_theta=2e4,
               partial_rotary_factor=0.5, layernorm_epsilon=1e-6, attention_value_scale=None,
               add_swa_attention_sink_bias=True, add_full_attention_sink_bias=False, routed_scaling_factor=None)
    cfg = from_hf_config(hub)
    assert cfg.layer_windows == (0, 129, 129, 0, 129, 129, 129) and cfg.dense_layers == (0, 1)
    assert cfg.layer_kv_heads == (2, 8, 8, 2, 8, 8, 8)
    assert (cfg.rope_theta, cfg.local_rope_theta, cfg.rotary_dim) == (2e6, 2e4, 16)
    assert (cfg.rms_norm_eps, cfg.value_scale, cfg.routed_scaling_factor) == (1e-6, 1.0, 1.0)


@pytest.mark.parametrize("change, message", [
    (dict(attention_bias=True), "attention_bias=True is not supported for MiMoV2FlashForCausalLM"),
    (dict(layer_types=["full_attention"] * 6), r"layer_types \[.*\] must list one of"),
    (dict(mlp_layer_types=["dense"] * 6 + ["shared"]), r"mlp_layer_types \[.*\] must list one of"),
    (dict(rope_parameters={"full_attention": dict(rope_theta=5e6, partial_rotary_factor=0.5),
                           "sliding_attention": dict(rope_theta=1e4, partial_rotary_factor=0.334)}),
     r"partial_rotary_factor \[0.334, 0.5\] is not supported: one factor"),
    (dict(hybrid_layer_pattern=[0, 1, 2, 1, 1, 0, 1]), r"hybrid_layer_pattern \[.*\] must list 0 or 1"),
    (dict(swa_head_dim=64), r"swa_head_dim 64 is not supported for MiMoV2FlashForCausalLM: the full layers' head_dim"),
    (dict(add_full_attention_sink_bias=True), "add_full_attention_sink_bias=True is not supported"),
    (dict(add_swa_attention_sink_bias=False), "add_swa_attention_sink_bias=False is not supported"),
])
def test_settings_not_run_are_refused_by_name(change, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**HF, **change})
