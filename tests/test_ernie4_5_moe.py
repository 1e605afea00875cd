"""ERNIE 4.5 MoE's pieces beyond the parity tests every family runs (test_hf_parity, test_families): the router
against transformers' own, and the multi-token-prediction block released checkpoints store beside the decoder."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import save_file

from jaxinfer import CheckpointError
from jaxinfer.checkpoint.loader import load_hf_weights
from jaxinfer.models.ernie4_5_moe import ErnieMoeLayerWeights, route
from jaxinfer.models.registry import load_config


@pytest.mark.parametrize("experts,k", [(8, 3), (64, 6)])
def test_route_matches_transformers_router(experts, k):
    """Same experts and weights as Ernie4_5_MoeTopKRouter on random rows, with a correction bias large enough
    to change choices (continuous scores: no ties)."""
    config = transformers.Ernie4_5_MoeConfig(hidden_size=16, moe_num_experts=experts, moe_k=k)
    router = transformers.models.ernie4_5_moe.modeling_ernie4_5_moe.Ernie4_5_MoeTopKRouter(config)
    torch.manual_seed(experts)
    with torch.no_grad():
        router.weight.normal_()
        router.moe_statics.e_score_correction_bias.normal_(0, 0.3)
        logits, expected_weights, expected_experts = router(torch.randn(50, 16))
    weights, chosen = route(jnp.asarray(logits.numpy()),
                            jnp.asarray(router.moe_statics.e_score_correction_bias.numpy()), k)
    order, want_order = np.argsort(np.asarray(chosen), -1), np.argsort(expected_experts.numpy(), -1)
    np.testing.assert_array_equal(np.take_along_axis(np.asarray(chosen), order, -1),
                                  np.take_along_axis(expected_experts.numpy(), want_order, -1))
    np.testing.assert_allclose(np.take_along_axis(np.asarray(weights), order, -1),
                               np.take_along_axis(expected_weights.numpy(), want_order, -1), rtol=1e-6, atol=1e-7)


def test_mtp_block_is_skipped_and_router_stays_float32(checkpoint_dir, tmp_path):
    """`model.mtp_*` tensors are not read where num_nextn_predict_layers says the checkpoint has them (and are
    refused by name where it does not); the router and its correction bias load float32 in a bf16 model."""
    src = checkpoint_dir("ernie4_5_moe")
    (tmp_path / "model.safetensors").symlink_to(src / "model.safetensors")
    save_file({"model.mtp_block.0.self_attn.q_proj.weight": np.ones((128, 64), np.float32),
               "model.mtp_emb_norm.0.weight": np.ones((64,), np.float32),
               "model.mtp_linear_proj.0.weight": np.ones((64, 128), np.float32)}, tmp_path / "mtp.safetensors")
    hf = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match=r"3 tensor\(s\) the config does not describe.*model.mtp_block.0"):
        load_hf_weights(tmp_path, load_config(tmp_path), jnp.float32, progress=False)
    (tmp_path / "config.json").write_text(json.dumps({**hf, "num_nextn_predict_layers": 1}))
    cfg = load_config(tmp_path)
    moe = load_hf_weights(tmp_path, cfg, jnp.bfloat16, progress=False).layers[1]
    assert isinstance(moe, ErnieMoeLayerWeights) and moe.shared_gate is not None
    assert (moe.router.dtype, moe.score_correction.dtype, moe.wq.dtype) == (jnp.float32, jnp.float32, jnp.bfloat16)
