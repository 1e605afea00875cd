"""Tiny random HF checkpoints of every supported architecture, saved and loaded like real ones."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import transformers


class _Lacking:
    """A transformers class this version lacks: building it skips the test that asked for it (the GPU machines'
    transformers is older than the CPU's, and one family's class must not stop every other test)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args, **kwargs):
        pytest.skip(f"transformers {transformers.__version__} has no {self.name}")


@functools.cache
def _hf_class(name: str) -> object:
    return getattr(transformers, name, None) or _Lacking(name)


class _Classes:
    """transformers' classes by attribute, each one this version lacks as a `_Lacking`."""

    def __getattr__(self, name: str) -> object:
        return _hf_class(name)


hf = _Classes()


COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    initializer_range=0.1,
)

ARCH_CONFIGS = {
    "llama2": (hf.LlamaConfig, dict(tie_word_embeddings=False)),
    "llama3": (
        hf.LlamaConfig,
        dict(
            num_key_value_heads=1,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    "llama_linear_rope": (
        hf.LlamaConfig,
        dict(rope_scaling=dict(rope_type="linear", factor=2.0), attention_bias=True, tie_word_embeddings=True),
    ),
    "mistral": (hf.MistralConfig, dict(sliding_window=16, tie_word_embeddings=False)),
    "qwen2": (hf.Qwen2Config, dict(tie_word_embeddings=True)),
    "qwen3": (hf.Qwen3Config, dict(head_dim=32, tie_word_embeddings=False)),
    "gemma": (hf.GemmaConfig, dict(head_dim=32, num_key_value_heads=1, hidden_activation="gelu_pytorch_tanh")),
    # Settings whose reading differs by architecture (see config.py).
    "llama_exact_gelu": (hf.LlamaConfig, dict(hidden_act="gelu")),
    "gemma_legacy_gelu": (hf.GemmaConfig, dict(head_dim=32, num_key_value_heads=1, hidden_act="gelu")),
    "qwen3_sliding": (
        hf.Qwen3Config,
        dict(head_dim=32, use_sliding_window=True, sliding_window=8, max_window_layers=1),
    ),
    "smollm3": (  # every other layer without rotary embeddings, the tied head transformers defaults it to
        hf.SmolLM3Config,
        dict(no_rope_layers=[1, 0], attention_bias=True, tie_word_embeddings=True, pad_token_id=0),
    ),
    "qwen2_layer_types": (
        hf.Qwen2Config,
        dict(use_sliding_window=True, sliding_window=12, layer_types=["sliding_attention", "full_attention"]),
    ),
}
# The families beyond Llama: windows shorter than the test prompts, caps small enough to bend scores.
ARCH_CONFIGS.update({
    "gemma2": (  # eager attention: transformers 5.17 runs Gemma 2 on SDPA, which drops the attention soft cap
        hf.Gemma2Config,
        dict(head_dim=32, sliding_window=8, query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
             final_logit_softcapping=3.0, hidden_activation="gelu_pytorch_tanh", attn_implementation="eager"),
    ),
    "gemma3": (
        hf.Gemma3TextConfig,
        dict(head_dim=32, sliding_window=8, query_pre_attn_scalar=24, layer_types=["sliding_attention", "full_attention"],
             rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=20.0),
                              "full_attention": dict(rope_type="linear", factor=2.0, rope_theta=10000.0)}),
    ),
    "phi3": (  # head_dim 96, LongRoPE (short factors: the tests' contexts stay within the original 256)
        hf.Phi3Config,
        dict(hidden_size=192, num_attention_heads=2, num_key_value_heads=1, pad_token_id=0, eos_token_id=2,
             original_max_position_embeddings=256,
             rope_scaling=dict(type="longrope", short_factor=[1.0 + i / 48 for i in range(48)],
                               long_factor=[1.0 + i / 8 for i in range(48)])),
    ),
    "olmo2": (hf.Olmo2Config, dict(pad_token_id=0, tie_word_embeddings=False)),
    "glm": (  # half of each 32-dim head turned (the default), in adjacent pairs; biased q/k/v; tied head
        hf.GlmConfig,
        dict(head_dim=32, pad_token_id=0, tie_word_embeddings=True),
    ),
    "glm4": (  # post-sublayer norms; 12 of 16 head dims turned, YaRN-scaled
        hf.Glm4Config,
        dict(head_dim=16, pad_token_id=0, rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=10000.0,
             partial_rotary_factor=0.75, original_max_position_embeddings=128)),
    ),
    "olmo3": (  # a window shorter than the prompts; yarn on the full layer only (transformers 4's layout)
        hf.Olmo3Config,
        dict(pad_token_id=0, sliding_window=8, layer_types=["sliding_attention", "full_attention"], rope_theta=5000.0,
             rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128)),
    ),
    "mixtral": (
        hf.MixtralConfig,
        dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, sliding_window=16),
    ),
    # DBRX: Wqkv clamped at 1.0 (a fifth of q/k/v entries clipped), bias-free LayerNorms; 2 of 4 experts
    # (fused w1/v1/w2 tensors) by softmax, divided by their 2-norm (the release's p is 1: an L1 renormalisation)
    "dbrx": (
        hf.DbrxConfig,
        dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=512, vocab_size=256,
             attn_config=dict(kv_n_heads=2, clip_qkv=1.0, rope_theta=1e4),
             ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2, moe_normalize_expert_weights=2.0)),
    ),
    # Phi-3.5-MoE: sparsemixer over 4 experts (a jitter threshold of 0.1, not the hub's 0.01, so that some tokens'
    # weights are softmaxes over several logits, not 1); LayerNorms, q/k/v/o and head biases; LongRoPE within the
    # original 256 positions, its cos and sin times the mscale 1.2
    "phimoe": (
        hf.PhimoeConfig,
        dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, attention_bias=True, lm_head_bias=True,
             router_jitter_noise=0.1, rope_parameters=dict(
                 rope_type="longrope", rope_theta=1e4, short_factor=[1.0 + i / 8 for i in range(8)],
                 long_factor=[1.0 + i for i in range(8)], short_mscale=1.2, long_mscale=1.2,
                 original_max_position_embeddings=256)),
    ),
    "qwen3_moe": (
        hf.Qwen3MoeConfig,
        dict(head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[0],
             tie_word_embeddings=False),
    ),
    "qwen2_moe": (  # a shared expert, routing weights not renormalised; layer 0 dense and (even) sliding
        hf.Qwen2MoeConfig,
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
             mlp_only_layers=[0], use_sliding_window=True, sliding_window=8, max_window_layers=1),
    ),
    "gpt_oss": (  # a swiglu_limit the tiny activations reach, so the experts' clamps act (where transformers reads
        hf.GptOssConfig,  # it: 5.17 hard-codes 7.0, which they never reach)
        dict(head_dim=16, num_local_experts=4, num_experts_per_tok=3, intermediate_size=32, sliding_window=8,
             layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False, initializer_range=0.2,
             **({"swiglu_limit": 0.5} if hasattr(hf.GptOssConfig, "swiglu_limit") else {})),
    ),
    "glm4_moe": (  # grouped routing: 8 experts in 4 groups, 3 chosen in the best 2; 2 shared experts; layer 0 dense;
        hf.Glm4MoeConfig,  # q/k norms and biases, half of each 32-dim head rotated (the default)
        dict(head_dim=32, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3, moe_intermediate_size=32,
             n_shared_experts=2, first_k_dense_replace=1, routed_scaling_factor=2.5, use_qk_norm=True,
             attention_bias=True, pad_token_id=0),
    ),
    # Granite: every multiplier away from 1 (attention_multiplier 0.3 replaces 16 ** -0.5); q/k/v/o biases
    "granite": (
        hf.GraniteConfig,
        dict(embedding_multiplier=3.0, attention_multiplier=0.3, residual_multiplier=0.7, logits_scaling=2.5,
             attention_bias=True, tie_word_embeddings=True),
    ),
    "granitemoe": (  # experts fused in input_linear / output_linear; top-k logits softmaxed among themselves
        hf.GraniteMoeConfig,
        dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, embedding_multiplier=2.0,
             attention_multiplier=0.2, residual_multiplier=0.6, logits_scaling=0.5),
    ),
    "granitemoe_shared": (  # a shared MLP beside the experts, gate and up fused in one tensor
        hf.GraniteMoeSharedConfig,
        dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, shared_intermediate_size=48,
             embedding_multiplier=2.0, attention_multiplier=0.2, residual_multiplier=0.6, logits_scaling=1.5),
    ),
    "seed_oss": (  # 32-dim heads (not 64 / 4), q/k/v biases by default and o's by attention_out_bias; Seed's theta
        hf.SeedOssConfig,
        dict(head_dim=32, attention_out_bias=True, rope_parameters=dict(rope_type="default", rope_theta=1e7)),
    ),
    "ernie4_5": (  # every dim of each 32-dim head turned in adjacent pairs; tied head (the default); theta 500000
        hf.Ernie4_5Config,
        dict(head_dim=32),
    ),
    "ernie4_5_moe": (  # layer 0 dense (moe_layer_start_index 1); 3 of 8 experts chosen by softmax + correction
        hf.Ernie4_5_MoeConfig,  # bias, renormalised; 2 ungated shared experts; head_dim beside hidden/heads
        dict(head_dim=32, moe_num_experts=8, moe_k=3, moe_intermediate_size=32, moe_num_shared_experts=2),
    ),
    "exaone4": (  # layer 0 slides over 8 tokens with Llama 3's rope; layer 1 attends to all without rope
        hf.Exaone4Config,  # post-sublayer norms, per-head q/k norms, head_dim beside hidden/heads
        dict(head_dim=32, sliding_window=8, sliding_window_pattern=2,
             rope_parameters=dict(rope_type="llama3", rope_theta=1e6, factor=16.0, low_freq_factor=1.0,
                                  high_freq_factor=4.0, original_max_position_embeddings=64)),
    ),
    "ministral3": (  # queries scaled past every 4 positions (the tests' prompts cross several); YaRN over 4 positions
        hf.Ministral3Config,  # head_dim 32 beside hidden/heads; Mistral's sliding window
        dict(head_dim=32, sliding_window=12, rope_parameters=dict(
            rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=4, beta_fast=32.0,
            beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.5)),
    ),
    "cohere2": (  # layer 0 slides over 8 tokens with interleaved rope, layer 1 attends to all without; logits x 0.25
        hf.Cohere2Config,  # one LayerNorm feeding attention and the MLP in parallel; q/k/v/o biases
        dict(sliding_window=8, sliding_window_pattern=2, logit_scale=0.25, attention_bias=True, layer_norm_eps=1e-5,
             tie_word_embeddings=False),
    ),
    "apertus": (  # q/k norms, q/k/v/o biases, an ungated xIELU MLP (slopes set apart by make_hf_model's noise)
        hf.ApertusConfig,  # Llama 3 rope over 64 original positions; head_dim 32 beside hidden/heads
        dict(head_dim=32, attention_bias=True, rope_parameters=dict(
            rope_type="llama3", rope_theta=1.2e7, factor=8.0, original_max_position_embeddings=64,
            low_freq_factor=1.0, high_freq_factor=4.0)),
    ),
    "arcee": (  # an ungated relu(x)^2 MLP; YaRN over 128 original positions, as AFM-4.5B's (x20 over 4096)
        hf.ArceeConfig,
        dict(head_dim=32, rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0,
                                               original_max_position_embeddings=128)),
    ),
    "olmoe": (  # 2 of 4 experts by softmax, not renormalised (the default); q/k norms over all heads; q/k/v/o biases
        hf.OlmoeConfig,
        dict(num_experts=4, num_experts_per_tok=2, intermediate_size=32, attention_bias=True, pad_token_id=0),
    ),
    "cohere": (  # Command R+: per-head q/k LayerNorms (a weight per head and dim); rope in adjacent pairs; logits x 0.25
        hf.CohereConfig,  # one LayerNorm feeding attention and the MLP in parallel; untied head
        dict(use_qk_norm=True, logit_scale=0.25, layer_norm_eps=1e-5, rope_theta=1e4, tie_word_embeddings=False),
    ),
    "nemotron": (  # LayerNorm1P (weight + 1, a bias) everywhere; ungated relu(x)^2 MLP; half of each 32-dim head rotated
        hf.NemotronConfig,
        dict(head_dim=32, norm_eps=1e-5, partial_rotary_factor=0.5, pad_token_id=0),
    ),
    "starcoder2": (  # LayerNorms with biases; q/k/v/o and c_fc/c_proj biased (use_bias, the default); a 16-token window
        hf.Starcoder2Config,
        dict(sliding_window=16, norm_epsilon=1e-5, tie_word_embeddings=False),
    ),
    "gpt_neox": (  # Pythia's layer: the residual in parallel, 4 of each 16-dim head's dims rotated (rotary_pct 0.25)
        hf.GPTNeoXConfig,  # q/k/v fused per head; LayerNorms and every projection biased; untied embed_out
        dict(),
    ),
    "gpt_neox_sequential": (  # attention, then the MLP; GPT-NeoX-20B's activation name
        hf.GPTNeoXConfig,
        dict(use_parallel_residual=False, hidden_act="gelu_fast"),
    ),
    "phi": (  # Phi-2's layer (one LayerNorm feeding attention and the MLP in parallel), 6 of each 16-dim head's dims
        hf.PhiConfig,  # rotated (Phi-2's 0.4); q/k LayerNorms (qk_layernorm) with biases; lm_head biased
        dict(qk_layernorm=True, partial_rotary_factor=0.4, layer_norm_eps=1e-5, pad_token_id=0),
    ),
    "gpt2": (  # learned positions (wpe), Conv1D weights, q/k/v fused in c_attn, tied head; n_inner 128 (not 4 x 64)
        hf.GPT2Config,
        dict(n_inner=128),
    ),
    "opt": (  # learned positions from row 2 of embed_positions, ReLU MLP fc1/fc2, q/k/v/out_proj and LayerNorms
        hf.OPTConfig,  # biased, tied head
        dict(ffn_dim=128, pad_token_id=0),
    ),
    "opt_350m": (  # OPT-350M's layout: post-norm layers (each sublayer's sum normed, no final LayerNorm), 48-wide
        hf.OPTConfig,  # embeddings and tied head, project_in / project_out to and from the 64-wide layers
        dict(ffn_dim=128, pad_token_id=0, do_layer_norm_before=False, word_embed_proj_dim=48),
    ),
    "gptj": (  # one LayerNorm feeding attention and the biased gelu_new MLP in parallel; 8 of each 16-dim head's dims
        hf.GPTJConfig,  # rotated in adjacent pairs; no q/k/v/out_proj biases; untied lm_head with a bias
        dict(rotary_dim=8, n_inner=128),
    ),
    "gpt_bigcode": (  # GPT-2's model over Linear weights with one K/V head (multi_query): c_attn's q rows, then k,
        hf.GPTBigCodeConfig,  # then v; learned positions, LayerNorms and projections biased, gelu-tanh MLP, tied
        dict(n_inner=128),
    ),
    "gpt_bigcode_mha": (  # multi_query false: every head its own K/V, c_attn per head ([heads, 3, head_dim])
        hf.GPTBigCodeConfig,
        dict(n_inner=128, multi_query=False, activation_function="gelu"),
    ),
    "stablelm": (  # LayerNorms with biases around Llama's gated MLP; 8 of each 16-dim head's dims rotated; q/k/v
        hf.StableLmConfig,  # biases; per-head q/k LayerNorms (qk_layernorm, a weight per head and dim, 2 KV heads)
        dict(use_qkv_bias=True, qk_layernorm=True, partial_rotary_factor=0.5, layer_norm_eps=1e-5),
    ),
    "stablelm_parallel": (  # StableLM 2 12B's layer: one LayerNorm feeding attention and the MLP in parallel
        hf.StableLmConfig,
        dict(use_parallel_residual=True, qk_layernorm=True, layer_norm_eps=1e-5),
    ),
    "falcon": (  # Falcon-7B's layer: one LayerNorm feeding attention and the gelu MLP in parallel, one K/V head
        hf.FalconConfig,  # (multi_query: query_key_value's q rows, then k, then v); rotary; no biases; tied head
        dict(ffn_hidden_size=128),
    ),
    "falcon_new": (  # Falcon-40B's: ln_attn and ln_mlp in parallel, 2 K/V groups (each group's q heads, k, v)
        hf.FalconConfig,
        dict(ffn_hidden_size=128, new_decoder_architecture=True, num_kv_heads=2),
    ),
    "falcon_sequential": (  # attention, then the MLP behind post_attention_layernorm; every head its own K/V
        hf.FalconConfig,
        dict(ffn_hidden_size=128, parallel_attn=False, multi_query=False),
    ),
    "falcon_rw": (  # Falcon-RW's: ALiBi (BLOOM's slopes, scaled with the scores), every head its own K/V,
        hf.FalconConfig,  # query_key_value, dense and the MLP biased; sequential
        dict(ffn_hidden_size=128, alibi=True, bias=True, parallel_attn=False, multi_query=False),
    ),
    "bloom": (  # ALiBi (BLOOM's slopes, 4 heads), the embeddings' LayerNorm, query_key_value per head, LayerNorms and
        hf.BloomConfig,  # projections biased, gelu-tanh MLP 4 x 64 wide, tied head
        dict(),
    ),
    "mpt": (  # ALiBi with MPT's slopes over 6 heads (not a power of two: the interleaved rule), Wqkv clamped
        hf.MptConfig,  # (clip_qkv 1.5), bias-free LayerNorms and projections, exact-GELU MLP, tied head
        dict(hidden_size=96, num_attention_heads=6, attn_config=dict(clip_qkv=1.5)),
    ),
    "minimax_m2": (  # 2 of 4 experts by sigmoid score + correction bias, renormalised; q/k norms over the whole
        hf.MiniMaxM2Config,  # projection (4 heads of 32 dims, beside hidden/heads); half of each head rotated (the
        dict(head_dim=32, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, rotary_dim=16,  # factor
             partial_rotary_factor=0.5),  # too: transformers 5.17 ignores the released rotary_dim and turns all 32)
    ),
    "mimo_v2_flash": (  # layer 0 full and dense; layer 1 slides over 8 tokens (7 + the query) with twice the kv heads
        hf.MiMoV2FlashConfig,  # and sinks, its own rope theta, over 3 of 8 experts in the best 2 of 4 groups;
        dict(head_dim=32, v_head_dim=16, sliding_window_size=7, n_routed_experts=8, n_group=4, topk_group=2,  # 10 of
             sliding_window=8,  # the same window as transformers 5.17 reads it (it ignores sliding_window_size)
             num_experts_per_tok=3, moe_intermediate_size=32, routed_scaling_factor=2.5,  # 32 head dims rotated
             layer_types=["full_attention", "sliding_attention"],
             rope_parameters={kind: dict(rope_type="default", rope_theta=theta, partial_rotary_factor=0.334)
                              for kind, theta in (("full_attention", 5e6), ("sliding_attention", 1e4))}),
    ),
    "exaone_moe": (  # EXAONE 4.0's attention (per-head q/k norms; layer 0 slides over 8 tokens with rotary, layer 1
        hf.ExaoneMoeConfig,  # full without: NoPE) in GLM-4.5's pre-norm MoE layer: layer 0 dense, layer 1
        dict(sliding_window=8, sliding_window_pattern=2, num_experts=8, n_group=4, topk_group=2,  # 3 of 8 experts
             num_experts_per_tok=3, moe_intermediate_size=32, num_shared_experts=2),  # in the best 2 of 4 groups
    ),
    "dots1": (  # Qwen3's attention (per-head q/k norms, q/k/v/o biases; layer 1 slides over 8 tokens) over GLM-4.5's
        hf.Dots1Config,  # MoE: 3 of 8 experts in the best 2 of 4 groups, not renormalised; layer 0 dense
        dict(head_dim=32, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3, moe_intermediate_size=32,
             n_shared_experts=2, first_k_dense_replace=1, routed_scaling_factor=2.5, attention_bias=True,
             sliding_window=8, max_window_layers=1),
    ),
    # q/k norms after rotary, whose base NTK-alpha scaling raises (alpha 1000: 10000 -> 1.6e7); a float32
    "hunyuan_moe": (
        hf.HunYuanMoEV1Config,  # router: 2 of 4 experts by softmax, renormalised, beside a shared MLP
        dict(head_dim=32, intermediate_size=32, num_experts=4, moe_topk=2, attention_bias=True,
             rope_parameters=dict(rope_type="dynamic", factor=1.0, alpha=1000.0, rope_theta=10000.0)),
    ),
    "hunyuan_dense": (  # the same attention (no biases) before Llama's MLP
        hf.HunYuanDenseV1Config,
        dict(head_dim=32, rope_parameters=dict(rope_type="dynamic", factor=1.0, alpha=1000.0, rope_theta=10000.0)),
    ),
    "solar_open": (  # GLM-4.5's MoE in every layer: 3 of 8 experts in the best 2 of 4 groups, scaled; 2 shared experts;
        hf.SolarOpenConfig,  # Llama's attention (q/k/v biases, no q/k norms, rotary over the whole head)
        dict(head_dim=32, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3, moe_intermediate_size=32,
             n_shared_experts=2, routed_scaling_factor=2.5, attention_bias=True),
    ),
    "sarvam_moe": (  # GLM-4.5's model (layer 0 dense; 3 of 8 experts in the best 2 of 4 groups; 2 shared experts; q/k
        hf.SarvamMoEConfig,  # norms) with rotary over the whole head; q, k, v and biases in one tensor
        dict(head_dim=32, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3, moe_intermediate_size=32,
             n_shared_experts=2, first_k_dense_replace=1, attention_bias=True),
    ),
})
# Llama 4: layer 0 rotary (Llama 3 scaling, adjacent pairs, q/k L2 norms) attending within chunks of 8 positions, with a
# dense MLP of 64; layer 1 NoPE over every key, queries scaled up every 4 positions, 2 of 4 experts (inputs scaled by
# their sigmoid scores) beside a shared expert of 32
ARCH_CONFIGS["llama4"] = (
    hf.Llama4TextConfig,
    dict(head_dim=32, intermediate_size=32, intermediate_size_mlp=64, num_local_experts=4, num_experts_per_tok=2,
         interleave_moe_layer_step=2, no_rope_layers=[1, 0], attention_chunk_size=8, floor_scale=4, attn_scale=0.5,
         rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                              high_freq_factor=4.0, original_max_position_embeddings=64)),
)
# DeepSeek's latent attention: a 32-value latent and 16 rotated dims cached per token; 16 + 16 query/key dims and
# 24 value dims per head (num_key_value_heads = heads, as transformers' MLA needs). Layer 0 dense.
MLA = dict(num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24,
           moe_intermediate_size=32, first_k_dense_replace=1, pad_token_id=0)
ARCH_CONFIGS.update({
    "deepseek_v2": (  # one q_proj; softmax routing within the best of 2 groups, scaled; YaRN (transformers 4 layout)
        hf.DeepseekV2Config,  # whose mscale_all_dim scales the softmax and mscale / mscale_all_dim cos, sin
        dict(**MLA, q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
             topk_method="group_limited_greedy", n_group=2, topk_group=1, routed_scaling_factor=1.5,
             rope_scaling=dict(type="yarn", factor=4.0, mscale=1.0, mscale_all_dim=0.8,
                               original_max_position_embeddings=128)),
    ),
    "deepseek_v3": (  # a low-rank query (q_a, norm, q_b); sigmoid routing: 8 experts in 4 groups, 3 in the best 2
        hf.DeepseekV3Config,  # 2 shared experts; YaRN with DeepSeek-V3's mscale 1 / mscale_all_dim 1
        dict(**MLA, q_lora_rank=24, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3,
             n_shared_experts=2, routed_scaling_factor=2.5,
             rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=10000.0, mscale=1.0, mscale_all_dim=1.0,
                                  original_max_position_embeddings=128)),
    ),
})
# MiniCPM3: DeepSeek-V2's latent attention (MLA's dims; a low-rank query) with rotary in halves, LongRoPE within
# the original 256 positions; a dense MLP in every layer; embeddings x 12, residual branches x 0.7 / sqrt(2), logits / 4
ARCH_CONFIGS["minicpm3"] = (
    hf.MiniCPM3Config,
    dict(num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24,
         q_lora_rank=24, scale_emb=12, scale_depth=0.7, dim_model_base=16, pad_token_id=0,
         rope_parameters=dict(rope_type="longrope", rope_theta=1e4, short_factor=[1.0 + i / 8 for i in range(8)],
                              long_factor=[1.0 + i for i in range(8)], original_max_position_embeddings=256)),
)
# GLM-4.7-Flash: DeepSeek-V3's layer under GLM's config (layer 0 dense by mlp_layer_types' default; 3 of 8 experts in
# the best 2 of 4 groups by sigmoid score + correction bias; 2 shared experts; plain rope in adjacent pairs).
# Mistral 4: V3's layer with its softmax router (2 of 8 experts in the best of 2 groups, renormalised, scaled) and
# Llama 4's query temperature (up every 16 positions, beta 0.5); YaRN x4 over those 16.
ARCH_CONFIGS.update({
    "glm4_moe_lite": (
        hf.Glm4MoeLiteConfig,
        dict(**MLA, q_lora_rank=24, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3,
             n_shared_experts=2, routed_scaling_factor=1.8, rope_parameters=dict(rope_type="default", rope_theta=1e4)),
    ),
    "mistral4": (
        hf.Mistral4Config,
        dict(**MLA, q_lora_rank=24, n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2,
             n_shared_experts=1, routed_scaling_factor=1.5,
             rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0, original_max_position_embeddings=16,
                                  beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                                  llama_4_scaling_beta=0.5, partial_rotary_factor=0.5)),
    ),
})
# DeepSeek-V3.2's sparse attention: V3's layers with an indexer keeping the 8 best tokens, so the 64-token prompt's
# later queries attend a few of their keys. 32 index heads of 24 dims (16 rotated): a score ties at exactly 0 (every
# head's relu 0; torch's topk and lax.top_k break such ties their own ways) once in 2^32, not once in 2^8.
DSA = dict(**MLA, q_lora_rank=24, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3,
           n_shared_experts=2, index_topk=8, index_head_dim=24, index_n_heads=32)
ARCH_CONFIGS["deepseek_v32"] = (hf.DeepseekV32Config, DSA)
# HY-V4: DSA's layers (8 best tokens) with sinks and an output gate, layer 2 reusing layer 1's choice ("shared"), four
# hyper-connection streams (write gates x 1.5); the experts' gate and up clamped at 0.5, so the clamp bites
ARCH_CONFIGS["hy_v4"] = (hf.HYV4Config, dict(DSA, num_hidden_layers=3, swiglu_limit=0.5, hc_magnitude=1.5))
# DeepSeek-V4: every layer kind (CSA over blocks of 4 keeping the indexer's 3 best, HCA over blocks of 8, sliding only;
# windows of 8), a hash-routed and two learned-routed MoE layers, two Sinkhorn-mixed streams; YaRN x4 on the compress
# rope; 32 index heads so a score never ties at 0; the experts' gate and up clamped at 0.5, so the clamp bites.
ARCH_CONFIGS["deepseek_v4"] = (hf.DeepseekV4Config, dict(
    num_hidden_layers=3, num_key_value_heads=1, head_dim=32, q_lora_rank=24, partial_rotary_factor=0.25, o_groups=2,
    o_lora_rank=16, index_n_heads=32, index_head_dim=16, index_topk=3, sliding_window=8,
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    layer_types=["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"],
    mlp_layer_types=["hash_moe", "moe", "moe"], n_routed_experts=8, num_experts_per_tok=2, intermediate_size=32,
    hc_mult=2, hc_sinkhorn_iters=3, swiglu_limit=0.5, routed_scaling_factor=1.5,
    rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, beta_fast=32.0,
                         beta_slow=1.0)))


def _mistral_large4_config(**text) -> object:
    """MistralLarge4Config of a text config and a tiny Pixtral tower (never run: the test models read text only)."""
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, head_dim=8,
                  patch_size=4, image_size=16)
    return hf.MistralLarge4Config(text_config=hf.MistralLarge4TextConfig(**text), vision_config=vision)


# Mistral Large 4 (its language model): DSA's indexer (8 best tokens) with no low-rank query, layer 0 dense with rope,
# layer 1 NoPE with 2 of 8 experts in the best of 2 softmax-scored groups; learned rotary alpha and query scales
# (norm-like 1-D leaves, randomised by make_hf_model); YaRN x4 over 16 positions; logits soft-capped at 5.
ARCH_CONFIGS["mistral_large4"] = (
    _mistral_large4_config,
    dict(MLA, n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2, routed_scaling_factor=1.5,
         index_topk=8, index_head_dim=24, index_n_heads=32, no_rope_layers=[1, 0], final_logit_softcapping=5.0,
         rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0, original_max_position_embeddings=16,
                              beta_fast=32.0, beta_slow=1.0, attention_factor=1.0)),
)
# Gemma 3n: sliding (window 8) and global layers in turn, layers 2-3 reading layers 0-1's K/V; the first two MLP
# gates cut at their 0.95 Gaussian quantile; layers 1 and 3's MLPs narrower; 4 AltUp streams, LAuReL rank 8,
# per-layer inputs of 8 over the first 200 ids (the prompt's ids past them read row 0)
ARCH_CONFIGS["gemma3n"] = (
    hf.Gemma3nTextConfig,
    dict(head_dim=16, sliding_window=8, pad_token_id=0, layer_types=["sliding_attention", "full_attention"] * 2,
         num_hidden_layers=4, num_kv_shared_layers=2, activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0],
         intermediate_size=[128, 96, 128, 96], altup_num_inputs=4, laurel_rank=8, hidden_size_per_layer_input=8,
         vocab_size_per_layer_input=200),
)
# Tested in their own modules, not by every parametrized family test (whose ~6 runs per family would cost a minute).
# Gemma 4 (test_gemma4): sliding layers (head_dim 8, 2 kv heads, window 8) and global ones (head_dim 16, 1 kv head,
# values = keys, proportional rope on a quarter of the dims); layers 2-3 read layers 0-1's K/V (their MLPs
# double-wide); per-layer inputs of 8; 4 experts (2 per token) beside every dense MLP. gemma4_dense: all of those
# off (v_proj, no sharing, no per-layer inputs or experts).
GEMMA4 = dict(head_dim=8, global_head_dim=16, sliding_window=8, pad_token_id=0, final_logit_softcapping=30.0)
# Mamba-1 (every layer a selective mixer: 128 channels, 16 state entries, dt rank "auto" = 4, a 4-wide conv) and
# FalconMamba (the same with weightless RMS norms on dt, B and C, an epsilon of 1e-3 that shows in the logits); heads
# untied (as FalconMamba-7B's): a tied one on these random weights picks mostly the input token, whatever the state.
ARCH_CONFIGS.update({
    "mamba": (hf.MambaConfig, dict(pad_token_id=0, tie_word_embeddings=False)),
    "falcon_mamba": (hf.FalconMambaConfig, dict(pad_token_id=0, mixer_rms_eps=1e-3, tie_word_embeddings=False)),
})
# Jamba: Mamba-1 layers (weighted dt, B, C norms) and NoPE GQA attention at layer 1 (period 3, offset 1); 2 of 4
# softmax-routed experts (not renormalised) at layer 0 (period 3, offset 0), a gated MLP elsewhere: Mamba + experts,
# attention + MLP, Mamba + MLP (Jamba's own three; attention + experts is any MoE family's layer).
ARCH_CONFIGS.update({
    "jamba": (hf.JambaConfig, dict(num_hidden_layers=3, intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                                   attn_layer_period=3, attn_layer_offset=1, expert_layer_period=3,
                                   expert_layer_offset=0, pad_token_id=0)),
})
# LFM3: a short conv (3 taps), a sliding layer (window 8, default rope of theta 1e4) and a full one (proportional
# rope turning half the frequencies of theta 1e6), the attention heads gated, every sublayer's output normed.
ARCH_CONFIGS["lfm3"] = (
    hf.Lfm3Config,
    dict(num_hidden_layers=3, head_dim=16, sliding_window=8, conv_L_cache=3, pad_token_id=0,
         layer_types=["conv", "sliding_attention", "full_attention"]),
)
# Kimi K2.5: DeepSeek-V3's tiny language model (above) under Kimi_K25ForConditionalGeneration, beside a one-block
# MoonViT tower and its projector (16 wide), the head untied as the outer config says.
KIMI_TOWER = dict(patch_size=4, pos_emb_height=4, pos_emb_width=4, pos_emb_time=1, num_attention_heads=2,
                  num_hidden_layers=1, hidden_size=16, intermediate_size=32)


def kimi_k25_config(**text) -> transformers.PretrainedConfig:
    """A Kimi_K25Config nesting DeepseekV3Config(**text) (the class skips the test where transformers lacks it)."""
    return hf.Kimi_K25Config(text_config=hf.DeepseekV3Config(**text).to_dict(), vision_config=KIMI_TOWER,
                             projection_hidden_size=16, tie_word_embeddings=False)


ARCH_CONFIGS["kimi_k25"] = (kimi_k25_config, ARCH_CONFIGS["deepseek_v3"][1])
# Apertus 1.5: Apertus' tiny model (above) over 300 ids, its head pruned to the first 256 (ids 256-299: input-only
# codes, whose embedding rows are not read).
ARCH_CONFIGS["apertus1p5"] = (hf.Apertus1p5TextConfig, dict(ARCH_CONFIGS["apertus"][1], vocab_size=300,
                                                            output_vocab_size=256, tie_word_embeddings=False))
# Laguna: a sliding layer (window 8, all 16 head dims rotated, theta 1e4) with a dense MLP, then a full one (half
# the head rotated, theta 5e5) with 2 of 4 sigmoid-routed experts (renormalised, x 1.5) beside a shared expert;
# q/k norms, one softplus output gate per head.
ARCH_CONFIGS["laguna"] = (
    hf.LagunaConfig,
    dict(head_dim=16, sliding_window=8, pad_token_id=0, layer_types=["sliding_attention", "full_attention"],
         num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
         moe_routed_scaling_factor=1.5),
)
# Cohere2-MoE: Cohere 2's parallel layer with RMSNorms (rms_norm_eps set); layer 0 dense (96 wide) and full with rope
# (force_rope), then a sliding layer (window 8) and a full NoPE one over 2 of 4 experts (the top-k logits'
# softmax) averaged with a shared expert; logits x 0.25
ARCH_CONFIGS["cohere2_moe"] = (
    hf.Cohere2MoeConfig,
    dict(num_hidden_layers=3, head_dim=16, intermediate_size=32, prefix_dense_intermediate_size=96, sliding_window=8,
         sliding_window_pattern=2, first_k_dense_replace=1, num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
         logit_scale=0.25, pad_token_id=0),
)
# LongCat-Flash: one layer of two halves, each MLA (a 32-value latent, 16 + 16 query/key dims, 24 value dims, a
# 24-rank query, rope in pairs over head_dim 16) and a 96-wide SwiGLU; the first half's MLP input feeds 2 of 4
# routed + 2 zero experts (softmax scores, correction bias for choosing, x 1.5), added after the second half
ARCH_CONFIGS["longcat_flash"] = (
    hf.LongcatFlashConfig,
    dict(num_layers=1, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=16, head_dim=16,
         qk_nope_head_dim=16, v_head_dim=24, ffn_hidden_size=96, expert_ffn_hidden_size=32, n_routed_experts=4,
         zero_expert_num=2, moe_topk=2, routed_scaling_factor=1.5, pad_token_id=0),
)
# VaultGemma: Gemma 2's attention (layer 0 slides over 8 tokens; scores scaled by 24 ** -0.5 and capped at 5) and
# capped logits in Llama's pre-norm layer (no post-sublayer norms)
ARCH_CONFIGS["vaultgemma"] = (
    hf.VaultGemmaConfig,
    dict(head_dim=32, sliding_window=8, query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
         final_logit_softcapping=3.0, attn_implementation="eager"),
)
# Persimmon: GPT-NeoX's sequential layer (query_key_value per head, LayerNorms and projections biased) around a
# relu(x)^2 MLP, q/k LayerNorms with one weight and bias every head shares, 8 of each 16-dim head's dims rotated
ARCH_CONFIGS["persimmon"] = (hf.PersimmonConfig, dict(layer_norm_eps=1e-5))
# OLMo 1: weightless LayerNorms; q/k/v/o biased, q, k and v clamped at 1.0 (a share of their entries clipped)
ARCH_CONFIGS["olmo"] = (hf.OlmoConfig, dict(clip_qkv=1.0, attention_bias=True, pad_token_id=0))
# Ministral: layer 0 slides over 8 tokens, layer 1 attends to all; head_dim 32 beside hidden/heads
ARCH_CONFIGS["ministral"] = (hf.MinistralConfig, dict(head_dim=32, sliding_window=8,
                                                      layer_types=["sliding_attention", "full_attention"]))
# Helium: rope in adjacent pairs over 16-dim heads, q/k/v biases (not o's), theta 1e5 (the default)
ARCH_CONFIGS["helium"] = (hf.HeliumConfig, dict(head_dim=16, attention_bias=True, pad_token_id=0))
# CWM: its default pattern (layer 0 full, layer 1 sliding over 8 tokens), Llama 3's rope over 64 original positions
ARCH_CONFIGS["cwm"] = (
    hf.CwmConfig,
    dict(head_dim=16, sliding_window=8, rope_parameters=dict(
        rope_type="llama3", rope_theta=1e6, factor=16.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64)),
)
# JetMoE: 2 of 4 attention experts per token (each 2 query heads of 16 dims over the 2 shared K/V heads) and 2 of
# 4 MLP experts (32 wide), each chosen by its top-2 logits softmaxed, each block with its output bias; an epsilon of
# 1e-2 that the final norm reads and the layers' norms (1e-6 whatever the config says) do not: it shows in the logits
ARCH_CONFIGS["jetmoe"] = (
    hf.JetMoeConfig,
    dict(kv_channels=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
         rms_norm_eps=1e-2),
)
# FlexOlmo: OLMo 2's post-norm layer (q/k norms over all heads, q/k/v/o biased) over 2 of 4 experts by softmax,
# renormalised
ARCH_CONFIGS["flex_olmo"] = (hf.FlexOlmoConfig, dict(num_experts=4, num_experts_per_tok=2, intermediate_size=32,
                                                     norm_topk_prob=True, attention_bias=True, pad_token_id=0))
# Mellum: Qwen3-MoE's layer; layer 0 slides over 8 tokens (theta 1e4) with a dense MLP, layer 1 attends to all (theta
# 5e5, the default) over 2 of 4 experts, renormalised
ARCH_CONFIGS["mellum"] = (
    hf.MellumConfig,
    dict(head_dim=16, sliding_window=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, pad_token_id=0,
         layer_types=["sliding_attention", "full_attention"], mlp_layer_types=["dense", "sparse"],
         rope_parameters={"full_attention": dict(rope_type="default", rope_theta=5e5),
                          "sliding_attention": dict(rope_type="default", rope_theta=1e4)}),
)
# nanochat: weightless RMSNorms (the embeddings' too), rope turned the other way, q/k normed after it, GQA; a
# relu(x)^2 MLP; logits capped at 3
ARCH_CONFIGS["nanochat"] = (hf.NanoChatConfig, dict(final_logit_softcapping=3.0))
# GPT-Neo: GPT-2's model with unscaled scores, q/k/v unbiased; layer 0 global, layer 1 local over 8 positions
ARCH_CONFIGS["gpt_neo"] = (hf.GPTNeoConfig, dict(num_layers=2, num_heads=4, window_size=8,
                                                 attention_types=[[["global", "local"], 1]]))
# Jais 2: LayerNorms with biases, q/k/v/o and the ungated relu(x)^2 MLP's up/down biased (all the defaults)
ARCH_CONFIGS["jais2"] = (hf.Jais2Config, dict(pad_token_id=0))
# HyperCLOVA X: Granite's multipliers away from 1 (the logits multiplied by 1.5), head_dim 32 beside hidden/heads (the
# scale its default 32 ** -0.5), each sublayer's output RMS-normed (use_post_norm, the default); q/k/v/o biases
ARCH_CONFIGS["hyperclovax"] = (
    hf.HyperCLOVAXConfig,
    dict(head_dim=32, embedding_multiplier=3.0, residual_multiplier=0.7, logits_scaling=1.5, attention_bias=True,
         pad_token_id=0),
)
# Youtu: DeepSeek-V3's latent attention (MLA's dims above, a 24-rank query, rope in adjacent pairs) in dense Llama
# layers; tied head (the default)
ARCH_CONFIGS["youtu"] = (hf.YoutuConfig, dict(num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=24,
                                              qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24, pad_token_id=0))
# Kolibri-1: GLM-4's sandwich norms; layer 0 slides over 8 tokens with rope, layer 1 attends to all without (EXAONE
# 4.0's attention, per-head q/k norms); 2 of 4 experts chosen by their logits plus a bias (set by make_hf_model's
# noise), weighted by their sigmoids and renormalised, beside a 48-wide shared expert
ARCH_CONFIGS["kolibri1"] = (
    hf.Kolibri1Config,
    dict(head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"], num_experts=4,
         num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=True,
         pad_token_id=0),
)
# CodeGen: GPT-J's model (8 of each 16-dim head's dims rotated in pairs) with q, v, k fused in 4 shards
# (hidden 128, 8 heads: two heads a shard, so a misread shard layout shows)
ARCH_CONFIGS["codegen"] = (hf.CodeGenConfig, dict(hidden_size=128, num_attention_heads=8, rotary_dim=8, n_inner=128))
# Flint: layer 0 dense and sliding over 8 tokens (rotated), layer 1 full without rope over 2 of 4 experts by
# sigmoid score, renormalised, beside a gated shared expert of 48; q/k norms; a sink per head
ARCH_CONFIGS["flint"] = (
    hf.FlintConfig,
    dict(head_dim=16, sliding_window=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
         shared_expert_intermediate_size=48, mlp_only_layers=[0], pad_token_id=0,
         layer_types=["sliding_attention", "full_attention"]),
)
# A.X-K1: DeepSeek-V3's tiny model (MLA's dims, a 24-rank query, rope in pairs) as one MoE layer (3 of 8 experts in
# the best 2 of 4 groups beside 2 shared ones; its dense layers are DeepSeek-V3's) with the MoE output RMS-normed
ARCH_CONFIGS["axk1"] = (
    hf.AXK1Config,
    dict(MLA, num_hidden_layers=1, mlp_layer_types=["sparse"], q_lora_rank=24, n_routed_experts=8, n_group=4,
         topk_group=2, num_experts_per_tok=3, n_shared_experts=2, routed_scaling_factor=2.5),
)
# BitNet (unquantized, as transformers runs its bf16 master weights): Llama's layer with the attention output and the
# MLP's relu(x)^2-gated product RMS-normed before their output projections; theta 500000 (the default)
ARCH_CONFIGS["bitnet"] = (hf.BitNetConfig, dict(pad_token_id=0))
# Hy3: layer 0 dense, layer 1 routes 3 of 8 experts by sigmoid score + expert_bias (set by make_hf_model's noise),
# renormalised and scaled by 2.5, beside a gated shared MLP of 2 x 32; per-head q/k norms; q/k/v/o biases
ARCH_CONFIGS["hy_v3"] = (
    hf.HYV3Config,
    dict(head_dim=32, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, num_shared_experts=2,
         router_scaling_factor=2.5, attention_bias=True, rope_parameters=dict(rope_type="default", rope_theta=1e4)),
)
# Granite SWA: Granite's multipliers; layer 0 full with base 1e6, layers 1-2 slide over 8 tokens with base 1e4 (the
# full and sliding layers' own bases); a sink logit per head (set by make_hf_model's noise)
ARCH_CONFIGS["granite_swa"] = (
    hf.GraniteSWAConfig,
    dict(num_hidden_layers=3, sliding_window=8, layer_types=["full_attention", "sliding_attention", "sliding_attention"],
         layer_rope_theta=[1e6, 1e4, 1e4], embedding_multiplier=3.0, attention_multiplier=0.3, residual_multiplier=0.7,
         logits_scaling=2.5, bos_token_id=1, eos_token_id=2),
)
# Granite-MoE SWA: Granite-MoE-Shared's layer (2 of 4 experts, a 48-wide shared MLP) with layer 0 sliding over 8
# tokens and layer 1 full without rope (layer_rope_theta 0); sinks
ARCH_CONFIGS["granitemoe_swa"] = (
    hf.GraniteMoeSWAConfig,
    dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, shared_intermediate_size=48,
         sliding_window=8, layer_types=["sliding_attention", "full_attention"], layer_rope_theta=[1e4, 0],
         embedding_multiplier=2.0, attention_multiplier=0.2, residual_multiplier=0.6, logits_scaling=1.5),
)
# AFMoE: layer 0 dense and sliding over 8 tokens (rotated), layer 1 full without rope, routing 3 of 8 experts by
# sigmoid score + expert_bias (make_hf_model's noise), renormalised, x 2.5, beside a gated shared MLP of 2 x 32;
# sandwich norms, per-head q/k norms, the sigmoid-gated attention output, q/k/v/o biases, muP's sqrt(64) embeddings
ARCH_CONFIGS["afmoe"] = (
    hf.AfmoeConfig,
    dict(head_dim=32, sliding_window=8, layer_types=["sliding_attention", "full_attention"], num_experts=8,
         num_experts_per_tok=3, moe_intermediate_size=32, num_shared_experts=2, route_scale=2.5, attention_bias=True,
         mup_enabled=True),
)
# Gemma 4 Unified: Gemma 4's tiny model (test_gemma4's) without per-layer inputs or experts, which it has none of:
# sliding and global layers of their own K/V shapes, values = keys on the global ones, layers 2-3 over layers 0-1's
# K/V with double-wide MLPs, layer scalars, the soft cap
ARCH_CONFIGS["gemma4_unified"] = (
    hf.Gemma4UnifiedTextConfig,
    dict(GEMMA4, num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2,
         num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2, use_double_wide_mlp=True),
)
# Cohere Compass: Cohere 2's parallel layer with a rope per layer type, rotated in halves: layer 0 slides over 8
# tokens with theta 1e4, layer 1 attends to all with theta 5e5 (M-RoPE sections: text positions reduce them to the
# plain rope); q/k/v/o biases; logits x 0.25
ARCH_CONFIGS["cohere_compass"] = (
    hf.CohereCompassTextConfig,
    dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"], attention_bias=True, logit_scale=0.25,
         layer_norm_eps=1e-5, pad_token_id=0,
         rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=1e4, mrope_section=[4, 2, 2]),
                          "full_attention": dict(rope_type="default", rope_theta=5e5, mrope_section=[4, 2, 2])}),
)
# Dory: a looped nGPT; 4 checkpoint layers: layer 0 once, layers 1-2 twice over (each pass its own pages), layer 3
# once (6 decoder layers); sliding (8 tokens, base 1e4) and full (base 1e7) in turn; q/k/v/o biases; rates 3x the
# default's so each sublayer moves the unit-normed stream visibly
ARCH_CONFIGS["dory"] = (
    hf.DoryConfig,
    dict(num_hidden_layers=4, head_dim=16, sliding_window=8, n_input_layers=1, n_recurrent_layers=2,
         n_output_layers=1, n_recurrent_loops=2, ngpt_alpha_init=0.3, attention_bias=True,
         layer_types=["sliding_attention", "full_attention"] * 2),
)
# LaraMini: a Gated DeltaNet layer (2 q/k heads of 8, 4 value heads of 16, its projections stored fused), a layer
# sliding over 8 tokens (rotated) and a full one without rope (per-head q/k norms); each routes 2 of 4 experts by
# float32 softmax, renormalised, beside an ungated 48-wide shared expert
ARCH_CONFIGS["lara_mini"] = (
    hf.LaraMiniConfig,
    dict(num_hidden_layers=3, head_dim=16, layer_types=["linear_attention", "sliding_attention", "full_attention"],
         sliding_window=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
         linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
         shared_expert_intermediate_size=48),
)
# OLMo Hybrid: a Gated DeltaNet layer (2 q/k heads of 16, 4 value heads of 8, beta doubled, each projection and conv
# input its own tensor; q, k and v equally wide, as transformers 5.24's save_pretrained cuts the joined conv in
# thirds), then OLMo 3's post-norm attention layer, rotated
ARCH_CONFIGS["olmo_hybrid"] = (
    hf.OlmoHybridConfig,
    dict(layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2, linear_key_head_dim=16,
         linear_num_value_heads=4, linear_value_head_dim=8, rope_parameters=dict(rope_type="default", rope_theta=1e4),
         pad_token_id=0),
)
# Ling hybrid: a KDA layer (4 heads of 16, one-projection gates, the safe forget gate bounded at -5), then latent
# attention (rank 16, 8 rotated dims in adjacent pairs, each head's output gated), each routing 2 of 8 experts within
# the best of 2 groups by sigmoid score + correction bias beside a shared expert (a dense MLP is Kimi Linear's)
ARCH_CONFIGS["bailing_hybrid"] = (
    hf.BailingHybridConfig,
    dict(num_key_value_heads=4, head_dim=16, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
         qk_nope_head_dim=16, v_head_dim=16, num_local_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
         moe_intermediate_size=32, first_k_dense_replace=0, num_mtp_layers=0, pad_token_id=0,
         layer_types=["linear_attention", "full_attention"], rope_theta=1e4),
)
# A.X-K2: DeepSeek-V3.2's tiny model (the indexer keeps the 8 best tokens) with its query and output gate from
# [normed, raw] q_a, gated norms of rank 8; layer 0 dense, layer 1 routes 3 of 8 experts without groups (n_group null)
ARCH_CONFIGS["axk2"] = (hf.AXK2Config, dict(DSA, n_group=None, topk_group=None, gated_norm_rank=8))
# HRM-Text: one layer a stack, 2 H cycles of 2 L runs each (6 decoder layers, each its own pages); multi-head
# attention (transformers' has no K/V groups) with the sigmoid output gate; weightless RMSNorms; embeddings x 10
# (1 / initializer_range); z_L_init away from its zeros (make_hf_model's noise)
ARCH_CONFIGS["hrm_text"] = (hf.HrmTextConfig, dict(num_hidden_layers=1, head_dim=16, H_cycles=2, L_cycles=2))
# Beam: layers 0-1 slide over 8 tokens (rotated), layer 2 is full without rope (its queries scaled by position);
# layer 0 dense, layers 1-2 route 3 of 8 experts within the best 2 of 4 groups by sigmoid score + correction bias
# (make_hf_model's noise), renormalised, x 2.5; sandwich norms, depth-scaled residual adds, per-head q/k norms, the
# output gate with a bias per head; logits soft-capped at 2 so the cap bites
ARCH_CONFIGS["beam"] = (
    hf.BeamConfig,
    dict(num_hidden_layers=3, head_dim=16, sliding_window=8, mlp_layer_types=["dense", "sparse", "sparse"],
         num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, n_group=4, topk_group=2,
         final_logit_softcapping=2.0),
)
# Inkling: a layer sliding over 8 tokens (4 K/V heads, its bias 8 back) with a dense MLP, then a full one (2 K/V heads,
# its bias 16 back, q and bias log-scaled from position 16) routing 2 of 4 experts beside 2 shared sink experts; no
# rope, 4-tap short convs on keys, values and both sublayers' outputs; the embeddings normed, logits / 4
INKLING = (
    hf.InklingTextConfig,
    dict(head_dim=16, swa_head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=4, d_rel=4, rel_extent=16,
         sliding_window_size=8, layer_types=["hybrid_sliding", "hybrid"], mlp_layer_types=["dense", "sparse"],
         intermediate_size=48, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=2,
         route_scale=2.0, logits_mup_width_multiplier=4.0, log_scaling_n_floor=16),
)
# DiffLlama: Llama's layer with differential attention (2 K/V heads split in halves, 4 query heads in two halves of
# 2, heads of 16; lambda_init by layer index: 0.2 and ~0.36)
ARCH_CONFIGS["diffllama"] = (hf.DiffLlamaConfig, dict(pad_token_id=0))
# ZAYA: layer 0 slides over 8 tokens, layer 1 attends to all (each type its base, half of each 16-dim head rotated);
# CCA q/k/v (two 2-tap convs: a conv state of the last 2 tokens beside the pages); the top-1 of 4 experts or skip,
# by a 16-wide router whose state layer 1 reads; per-channel residual scales and biases
ARCH_CONFIGS["zaya"] = (
    hf.ZayaConfig,
    dict(head_dim=16, num_experts=4, moe_intermediate_size=32, router_hidden_size=16, sliding_window=8,
         layer_types=["hybrid_sliding", "hybrid"]),
)
# Doge: Llama's layer (q/k norms) with each key's learned bias exp(A * softplus(dt_proj(v))) added to its scores (A
# away from its zeros by make_hf_model's noise) and the residual weighed per channel; 512 positions = the kept window
ARCH_CONFIGS["doge"] = (hf.DogeConfig, dict(keep_window_size=512))
# Step 3.7: its language model under Step3p7ForConditionalGeneration beside a one-layer tower and its projector:
# layer 0 slides over 8 tokens (theta 1e4, whole head) with a dense MLP, layer 1 attends to all (theta 5e5, half the
# head) through 2 of 4 sigmoid-routed experts (x 2) and a shared one; 1 + w norms, a sigmoid gate per head, scores x
# 24 ** -0.5; clamps after the SiLU on both layers (small, so that they bind)
STEP3P7_TEXT = dict(head_dim=16, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                    share_expert_dim=24, layer_types=["sliding_attention", "full_attention"], sliding_window=8,
                    mlp_layer_types=["dense", "sparse"], query_pre_attn_scalar=24, moe_router_scaling_factor=2.0,
                    swiglu_limits=[None, 0.5], swiglu_limits_shared=[0.4, 0.3], pad_token_id=0,
                    rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=1e4),
                                     "full_attention": dict(rope_type="default", rope_theta=5e5,
                                                            partial_rotary_factor=0.5)})


def step3p7_config(**text) -> transformers.PretrainedConfig:
    """A Step3p7Config nesting Step3p7TextConfig(**text) (the class skips the test where transformers lacks it)."""
    return hf.Step3p7Config(text_config=hf.Step3p7TextConfig(**text).to_dict(), vision_config=dict(
        width=32, layers=1, heads=2, image_size=28, patch_size=14, mlp_ratio=2.0))


ARCH_CONFIGS["step3p7"] = (step3p7_config, STEP3P7_TEXT)
# Muse Glimmer: its language model under MuseGlimmerForConditionalGeneration beside a one-layer tower: Gemma 2's
# sandwich (1 + w norms, the output norms' epsilon 1e-8) around weightless q/k norms (q x 2.5) and a sigmoid gate per
# head and dim; layer 0 slides over 8 tokens with rope, layer 1 attends to all without; normed embeddings; logits x
# 0.5 soft-capped at 5
MUSE_TOWER = dict(patch_size=4, pos_emb_height=4, pos_emb_width=4, num_attention_heads=2, num_hidden_layers=1,
                  hidden_size=16, intermediate_size=32, layer_types=["full_attention"])
MUSE_GLIMMER_TEXT = dict(head_dim=16, sliding_window=8, qk_scale_factor=2.5, output_multiplier=0.5,
                         final_logit_softcapping=5.0, pad_token_id=0)


def muse_glimmer_config(**text) -> transformers.PretrainedConfig:
    """A MuseGlimmerConfig nesting MuseGlimmerTextConfig(**text) (the class skips the test where transformers lacks
    it)."""
    return hf.MuseGlimmerConfig(text_config=hf.MuseGlimmerTextConfig(**text).to_dict(), vision_config=MUSE_TOWER)


ARCH_CONFIGS["muse_glimmer"] = (muse_glimmer_config, MUSE_GLIMMER_TEXT)
# MiniMax-M3: layer 0's indexer (2 heads, one per K/V head) keeps per query its own block of 4 keys and the best
# other (2 of up to 16 blocks) before a dense MLP (48 wide); layer 1 attends all keys, routing 2 of 4 experts by
# sigmoid score + correction bias (x 2) beside a 16-wide shared expert; clamped SwiGLU gates, Gemma's 1 + w norms,
# per-head q/k norms, half of each 16-dim head rotated
ARCH_CONFIGS["minimax_m3"] = (
    hf.MiniMaxM3VLTextConfig,
    dict(head_dim=16, rotary_dim=8, rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                                         partial_rotary_factor=0.5),
         intermediate_size=32, dense_intermediate_size=48, shared_intermediate_size=16, num_local_experts=4,
         num_experts_per_tok=2, index_n_heads=2, index_head_dim=16, index_block_size=4, index_topk_blocks=2,
         index_local_blocks=1, layer_types=["minimax_m3_sparse", "full_attention"],
         mlp_layer_types=["dense", "sparse"]),
)
# Muse Spark: Muse Glimmer's tiny language model (above) with the attention output normed per head, residual gates
# (T 0.3) and input-scaled output norms; layer 0 dense, layer 1 routes to 2 of 4 experts (x 1.5) at width 32, each
# expert's output normed; beside one-layer vision and audio towers
MUSE_SPARK_TEXT = dict(MUSE_GLIMMER_TEXT, mlp_layer_types=["dense", "sparse"], moe_hidden_size=32,
                       moe_intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, routed_scaling_factor=1.5,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e4})


def muse_spark_config(**text) -> transformers.PretrainedConfig:
    """A MuseSparkConfig nesting MuseSparkTextConfig(**text) (the class skips the test where transformers lacks it)."""
    audio = dict(patch_sizes=[2, 2, 2, 2], hidden_sizes=[8, 8, 8, 8], depths=[1, 1, 1, 1],
                 out_hidden_size=text["hidden_size"])
    return hf.MuseSparkConfig(text_config=hf.MuseSparkTextConfig(**text).to_dict(), vision_config=MUSE_TOWER,
                              audio_config=audio)


ARCH_CONFIGS["muse_spark"] = (muse_spark_config, MUSE_SPARK_TEXT)
OWN_MODULE_CONFIGS = {
    "glm_moe_dsa": (hf.GlmMoeDsaConfig, dict(DSA, n_group=1, topk_group=1,
                                                   num_hidden_layers=1, first_k_dense_replace=0)),  # one MoE layer
    "gemma4": (
        hf.Gemma4TextConfig,
        dict(GEMMA4, num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2,
             num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2, use_double_wide_mlp=True,
             hidden_size_per_layer_input=8, vocab_size_per_layer_input=256, enable_moe_block=True, num_experts=4,
             top_k_experts=2, moe_intermediate_size=32),
    ),
    "inkling": INKLING,  # its own test module (test_inkling): logits and an engine run off one LLM
    "gemma4_dense": (
        hf.Gemma4TextConfig,
        dict(GEMMA4, layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0),
    ),
}
# Families whose greedy tokens test_families checks (two prompts, prefix caching on and off).
ENGINE_TESTED = ("gemma2", "gemma3", "phi3", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "granitemoe_shared",
                 "glm4_moe", "ernie4_5_moe", "deepseek_v3", "olmoe", "llama4")
MODEL_CLASSES = {
    hf.MambaConfig: hf.MambaForCausalLM,
    hf.FalconMambaConfig: hf.FalconMambaForCausalLM,
    hf.JambaConfig: hf.JambaForCausalLM,
    hf.LlamaConfig: hf.LlamaForCausalLM,
    hf.MistralConfig: hf.MistralForCausalLM,
    hf.Qwen2Config: hf.Qwen2ForCausalLM,
    hf.Qwen3Config: hf.Qwen3ForCausalLM,
    hf.SmolLM3Config: hf.SmolLM3ForCausalLM,
    hf.GemmaConfig: hf.GemmaForCausalLM,
    hf.Gemma2Config: hf.Gemma2ForCausalLM,
    hf.Gemma3TextConfig: hf.Gemma3ForCausalLM,
    hf.Gemma4TextConfig: hf.Gemma4ForCausalLM,
    hf.Gemma3nTextConfig: hf.Gemma3nForCausalLM,
    hf.Phi3Config: hf.Phi3ForCausalLM,
    hf.Olmo2Config: hf.Olmo2ForCausalLM,
    hf.Olmo3Config: hf.Olmo3ForCausalLM,
    hf.GlmConfig: hf.GlmForCausalLM,
    hf.Glm4Config: hf.Glm4ForCausalLM,
    hf.MixtralConfig: hf.MixtralForCausalLM,
    hf.PhimoeConfig: hf.PhimoeForCausalLM,
    hf.DbrxConfig: hf.DbrxForCausalLM,
    hf.Qwen2MoeConfig: hf.Qwen2MoeForCausalLM,
    hf.Qwen3MoeConfig: hf.Qwen3MoeForCausalLM,
    hf.GptOssConfig: hf.GptOssForCausalLM,
    hf.Glm4MoeConfig: hf.Glm4MoeForCausalLM,
    hf.GraniteConfig: hf.GraniteForCausalLM,
    hf.GraniteMoeConfig: hf.GraniteMoeForCausalLM,
    hf.GraniteMoeSharedConfig: hf.GraniteMoeSharedForCausalLM,
    hf.SeedOssConfig: hf.SeedOssForCausalLM,
    hf.Ernie4_5Config: hf.Ernie4_5ForCausalLM,
    hf.Ernie4_5_MoeConfig: hf.Ernie4_5_MoeForCausalLM,
    hf.Exaone4Config: hf.Exaone4ForCausalLM,
    hf.Ministral3Config: hf.Ministral3ForCausalLM,
    hf.Cohere2Config: hf.Cohere2ForCausalLM,
    hf.ApertusConfig: hf.ApertusForCausalLM,
    hf.ArceeConfig: hf.ArceeForCausalLM,
    hf.OlmoeConfig: hf.OlmoeForCausalLM,
    hf.CohereConfig: hf.CohereForCausalLM,
    hf.NemotronConfig: hf.NemotronForCausalLM,
    hf.Starcoder2Config: hf.Starcoder2ForCausalLM,
    hf.MiniMaxM2Config: hf.MiniMaxM2ForCausalLM,
    hf.MiMoV2FlashConfig: hf.MiMoV2FlashForCausalLM,
    hf.ExaoneMoeConfig: hf.ExaoneMoeForCausalLM,
    hf.Dots1Config: hf.Dots1ForCausalLM,
    hf.HunYuanMoEV1Config: hf.HunYuanMoEV1ForCausalLM,
    hf.HunYuanDenseV1Config: hf.HunYuanDenseV1ForCausalLM,
    hf.SolarOpenConfig: hf.SolarOpenForCausalLM,
    hf.SarvamMoEConfig: hf.Glm4MoeForCausalLM,  # as transformers runs (and saves) it
    hf.GPTNeoXConfig: hf.GPTNeoXForCausalLM,
    hf.PhiConfig: hf.PhiForCausalLM,
    hf.GPT2Config: hf.GPT2LMHeadModel,
    hf.FalconConfig: hf.FalconForCausalLM,
    hf.BloomConfig: hf.BloomForCausalLM,
    hf.MptConfig: hf.MptForCausalLM,
    hf.StableLmConfig: hf.StableLmForCausalLM,
    hf.GPTBigCodeConfig: hf.GPTBigCodeForCausalLM,
    hf.GPTJConfig: hf.GPTJForCausalLM,
    hf.OPTConfig: hf.OPTForCausalLM,
    hf.Llama4TextConfig: hf.Llama4ForCausalLM,
    hf.DeepseekV2Config: hf.DeepseekV2ForCausalLM,
    hf.DeepseekV3Config: hf.DeepseekV3ForCausalLM,
    hf.DeepseekV32Config: hf.DeepseekV32ForCausalLM,
    hf.GlmMoeDsaConfig: hf.GlmMoeDsaForCausalLM,
    hf.HYV4Config: hf.HYV4ForCausalLM,
    hf.DeepseekV4Config: hf.DeepseekV4ForCausalLM,
    hf.Glm4MoeLiteConfig: hf.Glm4MoeLiteForCausalLM,
    hf.Mistral4Config: hf.Mistral4ForCausalLM,
    hf.MiniCPM3Config: hf.MiniCPM3ForCausalLM,
    hf.LongcatFlashConfig: hf.LongcatFlashForCausalLM,
    hf.Cohere2MoeConfig: hf.Cohere2MoeForCausalLM,
    _mistral_large4_config: hf.MistralLarge4ForConditionalGeneration,
    hf.LagunaConfig: hf.LagunaForCausalLM,
    kimi_k25_config: hf.Kimi_K25ForConditionalGeneration,
    step3p7_config: hf.Step3p7ForConditionalGeneration,
    muse_glimmer_config: hf.MuseGlimmerForConditionalGeneration,
    muse_spark_config: hf.MuseSparkForConditionalGeneration,
    hf.Apertus1p5TextConfig: hf.Apertus1p5TextForCausalLM,
    hf.Lfm3Config: hf.Lfm3ForCausalLM,
    hf.VaultGemmaConfig: hf.VaultGemmaForCausalLM,
    hf.PersimmonConfig: hf.PersimmonForCausalLM,
    hf.OlmoConfig: hf.OlmoForCausalLM,
    hf.MinistralConfig: hf.MinistralForCausalLM,
    hf.HeliumConfig: hf.HeliumForCausalLM,
    hf.CwmConfig: hf.CwmForCausalLM,
    hf.JetMoeConfig: hf.JetMoeForCausalLM,
    hf.FlexOlmoConfig: hf.FlexOlmoForCausalLM,
    hf.MellumConfig: hf.MellumForCausalLM,
    hf.NanoChatConfig: hf.NanoChatForCausalLM,
    hf.GPTNeoConfig: hf.GPTNeoForCausalLM,
    hf.Jais2Config: hf.Jais2ForCausalLM,
    hf.HyperCLOVAXConfig: hf.HyperCLOVAXForCausalLM,
    hf.YoutuConfig: hf.YoutuForCausalLM,
    hf.Kolibri1Config: hf.Kolibri1ForCausalLM,
    hf.CodeGenConfig: hf.CodeGenForCausalLM,
    hf.FlintConfig: hf.FlintForCausalLM,
    hf.AXK1Config: hf.AXK1ForCausalLM,
    hf.BitNetConfig: hf.BitNetForCausalLM,
    hf.HYV3Config: hf.HYV3ForCausalLM,
    hf.GraniteSWAConfig: hf.GraniteSWAForCausalLM,
    hf.GraniteMoeSWAConfig: hf.GraniteMoeSWAForCausalLM,
    hf.AfmoeConfig: hf.AfmoeForCausalLM,
    hf.Gemma4UnifiedTextConfig: hf.Gemma4UnifiedForCausalLM,
    hf.CohereCompassTextConfig: hf.CohereCompassForCausalLM,
    hf.DiffLlamaConfig: hf.DiffLlamaForCausalLM,
    hf.DoryConfig: hf.DoryForCausalLM,
    hf.LaraMiniConfig: hf.LaraMiniForCausalLM,
    hf.OlmoHybridConfig: hf.OlmoHybridForCausalLM,
    hf.BailingHybridConfig: hf.BailingHybridForCausalLM,
    hf.AXK2Config: hf.AXK2ForCausalLM,
    hf.HrmTextConfig: hf.HrmTextForCausalLM,
    hf.BeamConfig: hf.BeamForCausalLM,
    hf.InklingTextConfig: hf.InklingForCausalLM,
    hf.ZayaConfig: hf.ZayaForCausalLM,
    hf.DogeConfig: hf.DogeForCausalLM,
    hf.MiniMaxM3VLTextConfig: hf.MiniMaxM3VLForCausalLM,
}


def make_hf_model(name: str, **overrides) -> torch.nn.Module:
    """A random float32 HF model of the named tiny config (weights scaled up to give peaky logits)."""
    config_cls, extra = ARCH_CONFIGS[name] if name in ARCH_CONFIGS else OWN_MODULE_CONFIGS[name]
    config = config_cls(**{**COMMON, **extra, **overrides})
    torch.manual_seed(0)
    model = MODEL_CLASSES[config_cls](config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1 or name.endswith("_bias"):  # norms and biases: away from their trivial values
                param.add_(0.1 * torch.randn_like(param))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # routing bias (GLM-4.5, DeepSeek-V3, MiniMax-M2): 0 at init
                buffer.add_(0.1 * torch.randn_like(buffer))
            if name.endswith("tid2eid"):  # DeepSeek-V4's hash routing: zeros at init; k distinct experts a token
                buffer.copy_(torch.stack([torch.randperm(model.config.n_routed_experts)[:buffer.shape[1]]
                                          for _ in range(buffer.shape[0])]))
            if name.endswith(("act_fn.beta", "layer_scalar")):  # Apertus' xIELU term (0.5), Gemma 4's scalar (1)
                buffer.add_(0.1 * torch.randn_like(buffer))
    if type(model).__name__ == "Gemma3nForCausalLM":
        _per_layer_ids_clamped(model)
    return model


def _per_layer_ids_clamped(model: torch.nn.Module) -> None:
    """Gemma 3n's ids past vocab_size_per_layer_input read row 0 of the per-layer table, as transformers 5.24 reads
    them (5.17's Gemma3nForCausalLM indexes past its table; its Gemma3nModel, Google's checkpoints' class, clamps)."""
    text, rows = model.model, model.config.vocab_size_per_layer_input
    read = text.get_per_layer_inputs
    text.get_per_layer_inputs = lambda ids: read(torch.where((ids >= 0) & (ids < rows), ids, 0))


def save_hf_model(name: str, path: Path, dtype: torch.dtype = torch.float32, **overrides) -> Path:
    """Save a tiny model of the named config as an HF checkpoint directory."""
    model = make_hf_model(name, **overrides).to(dtype)
    model.save_pretrained(path, safe_serialization=True)
    return path


def make_hf_classifier(name: str, num_labels: int, **overrides) -> torch.nn.Module:
    """A random float32 `*ForSequenceClassification` of the named tiny config: `make_hf_model`'s decoder with a
    `score` head of num_labels rows (normal, std 0.2: logits of a few units, so no probability saturates)."""
    causal = make_hf_model(name, **overrides)
    fields = {k: v for k, v in causal.config.to_dict().items() if k not in ("id2label", "label2id")}
    config = type(causal.config)(**fields, num_labels=num_labels)
    model = getattr(transformers, type(causal).__name__.replace("ForCausalLM", "ForSequenceClassification"))(config)
    model.model.load_state_dict(causal.model.state_dict())
    torch.manual_seed(1)
    with torch.no_grad():
        model.score.weight.copy_(0.2 * torch.randn_like(model.score.weight))
    return model.eval()


TOKENIZER_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "for i in range(10):\n    print(i)\n",
    "héllo wörld — unicode ✓",
]


def save_tiny_tokenizer(path: Path, vocab_size: int = 300) -> Path:
    """Train a byte-level BPE tokenizer on a few lines and save it in HF format into `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TOKENIZER_CORPUS, trainer)
    fast = hf.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(path)
    return path
