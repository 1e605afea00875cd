"""Mixture-of-experts blocks: routing, the grouped expert MLPs (tiles on CPU, ragged_dot elsewhere)
against a per-row reference, and the MoE families' config fields."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from jaxinfer import ConfigError, from_hf_config
from jaxinfer.checkpoint.loader import load_hf_weights
from jaxinfer.models.grouped_matmul import expert_mlp, tile_rows, tiled_expert_mlp
from jaxinfer.models.moe import route
from jaxinfer.models.registry import load_config
from jaxinfer.models.weight_ops import narrow_experts, widen_experts
from jaxinfer.parallel.sharding import check_experts

E, D, F = 6, 16, 8


def _experts(seed: int = 0) -> tuple[jax.Array, jax.Array, jax.Array]:
    rng = np.random.RandomState(seed)
    return tuple(jnp.asarray(rng.randn(*shape), jnp.float32) for shape in ((E, D, F), (E, D, F), (E, F, D)))


def _per_row(x: np.ndarray, experts: list[int], gate, up, down) -> np.ndarray:
    """Each row through its own expert, one at a time (zeros for rows with no expert)."""
    out = np.zeros_like(x)
    for i, e in enumerate(experts):
        if e >= 0:
            h = jax.nn.silu(x[i] @ gate[e]) * (x[i] @ up[e])
            out[i] = h @ down[e]
    return out


@pytest.mark.parametrize("implementation", ["tiled", "ragged_dot", "gathered"])
@pytest.mark.parametrize("sizes", [[0, 1, 0, 0, 1, 0], [3, 0, 9, 1, 0, 2], [0, 0, 0, 0, 0, 5], [2, 0, 0, 0, 0, 0]])
def test_expert_mlp_sends_each_row_through_its_expert_only(implementation, sizes):
    rows = sum(sizes) + 3  # the last rows belong to no expert here (another device's): zeros
    x = np.random.RandomState(1).randn(rows, D).astype(np.float32)
    gate, up, down = _experts()
    experts = [e for e, n in enumerate(sizes) for _ in range(n)] + [-1] * 3
    run = jax.jit(expert_mlp, static_argnames=("act", "implementation"))
    got = run(jnp.asarray(x), gate, up, down, jnp.asarray(sizes, jnp.int32), act="silu", implementation=implementation)
    np.testing.assert_allclose(got, _per_row(x, experts, gate, up, down), rtol=2e-5, atol=2e-5)


def test_tiles_cover_large_groups_and_adapt_to_the_rows():
    assert tile_rows(2, 8) == 1 and tile_rows(32, 8) == 8 and tile_rows(512, 8) == 64
    sizes = [70, 0, 1, 63, 0, 64]  # groups longer than a tile, a tile exactly full, singletons
    x = np.random.RandomState(2).randn(sum(sizes), D).astype(np.float32)
    gate, up, down = _experts(3)
    experts = [e for e, n in enumerate(sizes) for _ in range(n)]
    got = jax.jit(tiled_expert_mlp, static_argnames=("act", "tile"))(
        jnp.asarray(x), gate, up, down, jnp.asarray(sizes, jnp.int32), act="silu", tile=16)
    np.testing.assert_allclose(got, _per_row(x, experts, gate, up, down), rtol=2e-5, atol=2e-5)


def test_cpu_tiles_multiply_one_expert_at_a_time():
    """No product spans the experts axis: the loop reads one expert's [D, F] weights per tile."""
    gate, up, down = _experts()
    x, sizes = jnp.ones((8, D), jnp.float32), jnp.asarray([8, 0, 0, 0, 0, 0], jnp.int32)
    hlo = jax.jit(tiled_expert_mlp, static_argnames="act").lower(x, gate, up, down, sizes, act="silu").as_text()
    operands = [re.findall(r"tensor<([0-9x]+)x[a-z]", line.split(":")[-1].split("->")[0])
                for line in hlo.splitlines() if "dot_general" in line]
    assert len(operands) == 3 and all(shape.count("x") == 1 for ops in operands for shape in ops), operands


def test_route_is_softmax_then_top_k():
    x = jnp.asarray(np.random.RandomState(4).randn(5, D), jnp.float32)
    router = jnp.asarray(np.random.RandomState(5).randn(D, E), jnp.float32)
    probs = np.asarray(jax.nn.softmax(x @ router, axis=-1))
    weights, experts = route(x, router, 2, renormalise=False)
    np.testing.assert_array_equal(experts, np.argsort(-probs, axis=-1)[:, :2])
    np.testing.assert_allclose(weights, np.take_along_axis(probs, np.asarray(experts), -1), rtol=1e-6)
    renormalised, _ = route(x, router, 2, renormalise=True)
    np.testing.assert_allclose(np.sum(renormalised, -1), 1.0, rtol=1e-6)


MOE = dict(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2,
           num_key_value_heads=1)


def test_moe_config_fields():
    mixtral = from_hf_config({**MOE, "architectures": ["MixtralForCausalLM"], "num_local_experts": 8,
                              "num_experts_per_tok": 2, "sliding_window": 16})
    assert (mixtral.num_experts, mixtral.experts_per_token, mixtral.moe_intermediate_size) == (8, 2, 32)
    assert mixtral.norm_topk_prob and mixtral.layer_windows == (16,) * 4 and mixtral.dense_layers == ()
    qwen = from_hf_config({**MOE, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4, "head_dim": 8,
                           "num_experts_per_tok": 1, "moe_intermediate_size": 12, "decoder_sparse_step": 2,
                           "mlp_only_layers": [3]})
    assert (qwen.num_experts, qwen.moe_intermediate_size, qwen.qk_norm, qwen.norm_topk_prob) == (4, 12, True, False)
    assert qwen.dense_layers == (0, 2, 3) and [qwen.is_moe_layer(i) for i in range(4)] == [False, True, False, False]


@pytest.mark.parametrize("architecture", ["MixtralForCausalLM", "Qwen3MoeForCausalLM"])
def test_routing_fields_a_config_leaves_out_take_transformers_defaults(architecture):
    hf_config = getattr(transformers, architecture).config_class(**MOE)
    cfg = from_hf_config({**MOE, "architectures": [architecture]})
    experts = getattr(hf_config, "num_local_experts", None) or hf_config.num_experts
    moe_width = getattr(hf_config, "moe_intermediate_size", hf_config.intermediate_size)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size) == (
        experts, hf_config.num_experts_per_tok, moe_width)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(num_local_experts=4, num_experts_per_tok=5), "num_experts_per_tok 5 must be between 1 and the 4"),
        (dict(num_local_experts=0), "num_local_experts 0 must be >= 1"),
    ],
)
def test_moe_configs_that_cannot_run_are_rejected(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**MOE, "architectures": ["MixtralForCausalLM"], **fields})


QWEN2_MOE = {**MOE, "architectures": ["Qwen2MoeForCausalLM"], "num_experts": 8, "moe_intermediate_size": 12}


def test_qwen2_moe_config_fields():
    """As transformers reads them: q/k/v biases, its defaults, sliding on even layers below max_window_layers."""
    cfg = from_hf_config({**QWEN2_MOE, "shared_expert_intermediate_size": 24, "decoder_sparse_step": 2})
    assert (cfg.qkv_bias, cfg.o_bias, cfg.qk_norm, cfg.norm_topk_prob) == (True, False, False, False)
    assert (cfg.experts_per_token, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size) == (4, 12, 24)
    assert cfg.dense_layers == (0, 2) and cfg.layer_windows == (0,) * 4
    defaults = from_hf_config({**MOE, "architectures": ["Qwen2MoeForCausalLM"], "num_experts": None, "qkv_bias": False})
    assert (defaults.num_experts, defaults.moe_intermediate_size, defaults.shared_expert_intermediate_size) == (
        60, 1408, 5632)
    assert not defaults.qkv_bias
    sliding = from_hf_config({**QWEN2_MOE, "use_sliding_window": True, "sliding_window": 6, "max_window_layers": 3})
    assert sliding.layer_windows == (6, 0, 6, 0)  # Qwen2 would slide layer 3 only
    listed = from_hf_config({**QWEN2_MOE, "use_sliding_window": True, "sliding_window": 6,
                             "layer_types": ["full_attention"] * 3 + ["sliding_attention"]})
    assert listed.layer_windows == (0, 0, 0, 6)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(layer_types=["sliding_attention"] * 4), "has sliding layers but no window"),
        (dict(shared_expert_intermediate_size=0), "shared_expert_intermediate_size 0 must be >= 1"),
    ],
)
def test_qwen2_moe_configs_that_cannot_run_are_rejected(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**QWEN2_MOE, **fields})


def test_expert_parallel_sizes_are_checked():
    check_experts(8, 4)
    with pytest.raises(ValueError, match="expert_parallel_size=3 does not divide the model's 8 experts; use one of"):
        check_experts(8, 3)
    with pytest.raises(ValueError, match="expert_parallel_size=2 needs a mixture-of-experts model"):
        check_experts(0, 2)


def test_experts_narrow_back_by_a_layer_with_output_norms_only(checkpoint_dir):
    """FlexOlmo's MoE layers norm after their sublayers (no attn_norm): experts widened to float32 for the CPU come
    back in bfloat16 by its output norm's dtype, as save_converted's unpack_for_cpu narrows them."""
    path = checkpoint_dir("flex_olmo")
    weights = load_hf_weights(path, load_config(path), jnp.bfloat16, progress=False)
    widened = widen_experts(weights)
    assert widened.layers[0].moe_gate.dtype == jnp.float32
    narrowed = narrow_experts(widened)
    assert {getattr(lw, name).dtype for lw in narrowed.layers for name in type(lw).EXPERTS} == {jnp.dtype("bfloat16")}
