"""GLM-4.5's pieces beyond the parity tests every family runs (test_hf_parity, test_families): DeepSeek-V3's
grouped routing against transformers' own router, the float32 router leaves of a bf16 model through load and
convert, and the multi-token-prediction layers real checkpoints store after the decoder's."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import save_file

from jaxinfer import CheckpointError, ConfigError, save_converted
from jaxinfer.checkpoint.converted import restore_converted, stored_dtype
from jaxinfer.checkpoint.loader import load_hf_weights
from jaxinfer.models.glm4_moe import Glm4MoeLayerWeights
from jaxinfer.models.grouped_topk import check_groups, grouped_topk
from jaxinfer.models.registry import load_config


def _sorted_by_expert(weights: np.ndarray, experts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (weights, experts) in expert order (torch's topk leaves them unsorted)."""
    order = np.argsort(experts, axis=-1)
    return np.take_along_axis(weights, order, -1), np.take_along_axis(experts, order, -1)


@pytest.mark.parametrize(
    "experts,groups,groups_per_token,k,renormalise,scaling",
    [(8, 4, 2, 3, True, 2.5), (16, 4, 1, 4, False, 1.0), (12, 1, 1, 5, True, 1.0), (32, 8, 3, 6, True, 2.5)],
)
def test_grouped_topk_matches_transformers_router(experts, groups, groups_per_token, k, renormalise, scaling):
    """Same experts and weights as Glm4MoeTopkRouter on random rows (continuous scores: no ties)."""
    config = transformers.Glm4MoeConfig(hidden_size=16, n_routed_experts=experts, n_group=groups,
                                        topk_group=groups_per_token, num_experts_per_tok=k,
                                        norm_topk_prob=renormalise, routed_scaling_factor=scaling)
    router = transformers.models.glm4_moe.modeling_glm4_moe.Glm4MoeTopkRouter(config)
    torch.manual_seed(experts)
    with torch.no_grad():
        router.weight.normal_()
        router.e_score_correction_bias.normal_(0, 0.3)  # large enough to change choices
        logits, expected_weights, expected_experts = router(torch.randn(50, 16))
    weights, chosen = grouped_topk(jnp.asarray(logits.numpy()), jnp.asarray(router.e_score_correction_bias.numpy()),
                                   k, groups, groups_per_token, renormalise, scaling)
    got_w, got_e = _sorted_by_expert(np.asarray(weights), np.asarray(chosen))
    want_w, want_e = _sorted_by_expert(expected_weights.numpy(), expected_experts.numpy())
    np.testing.assert_array_equal(got_e, want_e)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-6, atol=1e-7)


def test_grouped_topk_chooses_within_the_best_groups_by_biased_scores():
    """Group 1 (best two biased scores 0.9 + 0.8) beats group 0 (0.95 + 0.1); weights are the unbiased scores."""
    scores = np.array([[0.95, 0.1, 0.9, 0.5]], np.float32)
    logits = jnp.asarray(np.log(scores / (1 - scores)))
    correction = jnp.asarray([0.0, 0.0, 0.0, 0.3])
    weights, chosen = grouped_topk(logits, correction, 2, 2, 1, renormalise=False, scaling=2.0)
    assert sorted(np.asarray(chosen)[0].tolist()) == [2, 3]
    np.testing.assert_allclose(sorted(np.asarray(weights)[0]), [1.0, 1.8], rtol=1e-5)


@pytest.mark.parametrize(
    "groups,groups_per_token,k,message",
    [(3, 1, 2, "n_group 3 must divide the 8"), (8, 1, 1, "leaves 1 expert per group"),
     (4, 5, 2, "topk_group 5 must be between 1 and n_group 4"), (4, 1, 3, "num_experts_per_tok 3 is more than the 2")],
)
def test_groupings_transformers_cannot_run_are_refused_by_name(groups, groups_per_token, k, message):
    with pytest.raises(ConfigError, match=message):
        check_groups(8, groups, groups_per_token, k)


def test_bf16_model_keeps_its_router_float32_through_convert(checkpoint_dir, tmp_path):
    """The router and correction bias load as float32 in a bf16 model (as transformers keeps them), the
    converted checkpoint states bf16 and restores them float32 again."""
    path = checkpoint_dir("glm4_moe")
    cfg = load_config(path)
    weights = load_hf_weights(path, cfg, jnp.bfloat16, progress=False)
    moe = weights.layers[1]
    assert isinstance(moe, Glm4MoeLayerWeights) and moe.shared_expert_gate is None
    assert (moe.router.dtype, moe.score_correction.dtype, moe.wq.dtype) == (jnp.float32, jnp.float32, jnp.bfloat16)
    assert stored_dtype(weights, cfg) == "bfloat16"
    restored = restore_converted(save_converted(weights, path, tmp_path / "converted"), cfg, jnp.bfloat16)
    assert (restored.layers[1].router.dtype, restored.layers[1].moe_gate.dtype) == (jnp.float32, jnp.bfloat16)
    np.testing.assert_array_equal(restored.layers[1].score_correction, moe.score_correction)


def test_mtp_layers_after_the_decoders_are_skipped(checkpoint_dir, tmp_path):
    """Tensors of layer num_hidden_layers (the MTP layer real checkpoints hold) are not read; one layer past
    num_nextn_predict_layers is still refused as a tensor the config does not describe."""
    src = checkpoint_dir("glm4_moe")
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).symlink_to(src / name)
    mtp = {"model.layers.2.eh_proj.weight": np.ones((64, 128), np.float32),
           "model.layers.2.mlp.experts.0.gate_proj.weight": np.ones((32, 64), np.float32)}
    save_file(mtp, tmp_path / "mtp.safetensors")
    cfg = load_config(tmp_path)
    assert cfg.mtp_layers == 1
    weights = load_hf_weights(tmp_path, cfg, jnp.float32, progress=False)
    np.testing.assert_array_equal(weights.layers[1].router, load_hf_weights(src, cfg, jnp.float32,
                                                                            progress=False).layers[1].router)
    save_file({"model.layers.3.eh_proj.weight": np.ones((64, 128), np.float32)}, tmp_path / "mtp.safetensors")
    with pytest.raises(CheckpointError, match=r"1 tensor\(s\) the config does not describe.*model.layers.3"):
        load_hf_weights(tmp_path, cfg, jnp.float32, progress=False)
