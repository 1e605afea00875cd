"""DeepSeek-V2/V3's pieces beyond the parity tests every family runs (test_hf_parity, test_families): the compressed
latent cache against transformers' own, DeepSeek-V3's rotate-half layout, V2's softmax routing against transformers'
router, and the cache bytes a token takes at DeepSeek-V3's real shape."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hf_models import make_hf_model, save_hf_model

from jaxinfer import LLM, from_hf_config
from jaxinfer.cache.contiguous import cache_bytes, init_cache
from jaxinfer.cache.paged import page_bytes
from jaxinfer.checkpoint.loader import load_hf_weights
from jaxinfer.models import forward
from jaxinfer.models.limited_greedy import limited_greedy
from jaxinfer.models.registry import load_config

PROMPT = np.random.RandomState(1).randint(3, 256, size=12).tolist()


def test_cache_holds_the_normed_latent_and_rotated_key_part_as_transformers_caches_them(checkpoint_dir):
    """One row [c, k_pe] per token and layer (R + P = 48 values, as both key and value): c and k_pe equal what
    transformers' DynamicCache holds for DeepSeek-V2 (whose k_pe keeps the adjacent-pair layout ours has)."""
    path = checkpoint_dir("deepseek_v2")
    cfg = load_config(path)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rotated_dims) == (1, 48, 16)
    weights = load_hf_weights(path, cfg, jnp.float32, progress=False)
    tokens = jnp.asarray([PROMPT])
    _, cache = forward(weights, tokens, jnp.arange(len(PROMPT))[None], init_cache(cfg, 1, 16, jnp.float32), cfg)
    assert cache_bytes(cache) == cfg.num_layers * 2 * 16 * 48 * 4  # layers x (K, V) x positions x row x float32
    with torch.no_grad():
        out = make_hf_model("deepseek_v2")(torch.tensor([PROMPT]), use_cache=True)
    theirs = out.cache if hasattr(out, "cache") else out.past_key_values  # transformers 5.17's name
    for layer in range(cfg.num_layers):
        rows = np.asarray(cache.k[layer][0, 0, : len(PROMPT)])
        np.testing.assert_allclose(rows[:, :32], theirs.layers[layer].keys[0, 0].numpy(), atol=2e-5)
        np.testing.assert_allclose(rows[:, 32:], theirs.layers[layer].values[0, 0].numpy(), atol=2e-5)
        np.testing.assert_array_equal(np.asarray(cache.v[layer][0, 0, :, : len(PROMPT)]).T, rows)


def test_deepseek_v3_rotate_half_layout_matches_hf(tmp_path):
    """rope_interleave false: the rope dims turn in halves (the parity configs turn adjacent pairs)."""
    path = save_hf_model("deepseek_v3", tmp_path, rope_interleave=False)
    prompt = np.random.RandomState(0).randint(3, 256, size=64).tolist()
    with torch.no_grad():
        expected = make_hf_model("deepseek_v3", rope_interleave=False)(torch.tensor([prompt])).logits[0].numpy()
    llm = LLM(path, dtype="float32", max_seq_len=128, cpu_kernels=False)
    assert not llm.config.rope_interleaved
    assert np.abs(llm.logits(prompt) - expected).max() <= 1e-5 * np.abs(expected).max()


def _sorted_by_expert(weights: np.ndarray, experts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (weights, experts) in expert order (torch's topk leaves them unsorted)."""
    order = np.argsort(experts, axis=-1)
    return np.take_along_axis(weights, order, -1), np.take_along_axis(experts, order, -1)


@pytest.mark.parametrize(
    "experts,method,groups,groups_per_token,k,scaling",
    [(8, "greedy", None, None, 3, 1.0), (16, "group_limited_greedy", 4, 2, 3, 1.5),
     (12, "group_limited_greedy", 6, 1, 2, 16.0)],
)
def test_limited_greedy_matches_transformers_router(experts, method, groups, groups_per_token, k, scaling):
    """Same experts and weights as DeepseekV2TopkRouter on random rows (softmax scores, never renormalised)."""
    config = transformers.DeepseekV2Config(hidden_size=16, num_attention_heads=2, n_routed_experts=experts,
                                           topk_method=method, n_group=groups, topk_group=groups_per_token,
                                           num_experts_per_tok=k, routed_scaling_factor=scaling)
    router = transformers.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2TopkRouter(config)
    torch.manual_seed(experts)
    with torch.no_grad():
        router.weight.normal_()
        logits, expected_weights, expected_experts = router(torch.randn(50, 16))
    open_groups = (groups, groups_per_token) if method == "group_limited_greedy" else (1, 1)
    weights, chosen = limited_greedy(jnp.asarray(logits.numpy()), k, *open_groups, scaling)
    got_w, got_e = _sorted_by_expert(np.asarray(weights), np.asarray(chosen))
    want_w, want_e = _sorted_by_expert(expected_weights.numpy(), expected_experts.numpy())
    np.testing.assert_array_equal(got_e, want_e)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-6, atol=1e-7)


def test_deepseek_v3_caches_576_values_a_token_and_layer():
    """At DeepSeek-V3's shape (transformers' defaults: 61 layers, 128 heads) a token's pages hold one row of
    kv_lora_rank 512 + qk_rope_head_dim 64 per layer, as key and value: 140.5 kB in bf16, 1/35.6 of the 5.0 MB
    per-head keys (192 dims) and values (128) would take."""
    cfg = from_hf_config(dict(architectures=["DeepseekV3ForCausalLM"], vocab_size=129280, hidden_size=7168,
                              intermediate_size=18432, num_hidden_layers=61, num_attention_heads=128))
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.num_layers) == (1, 576, 61)
    ours = page_bytes(cfg, 1, jnp.bfloat16)
    per_head = cfg.num_layers * cfg.num_heads * (192 + 128) * 2
    assert (ours, per_head) == (2 * 61 * 576 * 2, 4_997_120)
