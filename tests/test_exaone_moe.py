"""K-EXAONE's config as transformers reads it (test_hf_parity checks its logits against HF's): which layers are
dense, slide and rotate, and what is refused by name."""

from __future__ import annotations

import pytest

from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import from_hf_config

HF = dict(architectures=["ExaoneMoeForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, num_experts=8, moe_intermediate_size=32)


def test_defaults_follow_transformers():
    """Every 4th layer full and without rotary, the first dense; 1 shared expert of moe_intermediate_size, 8 of 64
    experts scaled by 2.5."""
    cfg = from_hf_config(HF)
    assert cfg.layer_windows == (4096, 4096, 4096, 0) and cfg.nope_layers == (3,)
    assert cfg.dense_layers == (0,) and cfg.qk_norm
    assert (cfg.shared_expert_intermediate_size, cfg.experts_per_token, cfg.routed_scaling_factor) == (32, 8, 2.5)


def test_mlp_layer_types_take_precedence_and_a_null_window_rotates_every_layer():
    cfg = from_hf_config({**HF, "mlp_layer_types": ["sparse", "dense", "sparse", "dense"], "first_k_dense_replace": 3,
                          "sliding_window": None})
    assert cfg.dense_layers == (1, 3)
    assert cfg.layer_windows == (0,) * 4 and cfg.nope_layers == ()


@pytest.mark.parametrize("change, message", [
    (dict(mlp_layer_types=["dense", "moe", "sparse", "sparse"]), r"mlp_layer_types \[.*\] must list 'dense' or"),
    (dict(num_shared_experts=0), "num_shared_experts 0 is not supported for ExaoneMoeForCausalLM"),
    (dict(sliding_window_pattern="LLLG"), "sliding_window_pattern 'LLLG' is not supported without layer_types"),
])
def test_settings_not_run_are_refused_by_name(change, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**HF, **change})
