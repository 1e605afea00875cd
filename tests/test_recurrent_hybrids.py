"""Zamba (v1: Mamba-1 layers with per-head x_proj, some running the one shared attention block over [x, input
embeddings]: models/zamba) and RecurrentGemma (Griffin: RG-LRU recurrent blocks and sliding-window MQA, soft-capped
logits: models/recurrent_gemma, models/rg_lru) against transformers on the same tiny saved weights: logits over a
40-token prompt (five times RecurrentGemma's 8-token window), and an engine run batching two prompts (the 28-token
one prefilled over three steps beside the other's) giving each prompt transformers' greedy tokens for it alone (the
state pools' preemption and recompute: Bamba's, Falcon-H1's and Qwen3-Next's tests); Zamba's shared block held
once; the configs read as transformers reads them, and what is not run refused by name."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from jaxinfer import LLM, ConfigError, SamplingParams, from_hf_config

# Zamba: Mamba-1 layers of 64 channels in 2 heads (each with its own x_proj, dt_proj, B and C), layers 1 and 2
# hybrid (the one shared block, stored under layer 1), attention over [x, embeddings] in 4 heads of 16 dims.
ZAMBA = dict(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=4, n_mamba_heads=2, mamba_d_state=8, mamba_dt_rank=4,
             layers_block_type=["mamba", "hybrid", "hybrid"], initializer_range=0.1,
             max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# RecurrentGemma: a recurrent layer, then an attention layer; the RG-LRU 48 wide (gates in 4 blocks of 12), a 4-tap
# conv; multi-query attention (4 heads of 8 dims, half of each rotated) over windows of 8 keys; the MLP 48 wide (half of
# intermediate_size); w_init_variance_scale 1 (training-only: it only widens the random init, so greedy tokens vary).
RECURRENT_GEMMA = dict(vocab_size=256, hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=1, lru_width=48, attention_window_size=8, conv1d_width=4,
                       block_types=["recurrent", "attention"], w_init_variance_scale=1.0, max_position_embeddings=512,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0)
PROMPT = np.random.RandomState(2).randint(3, 256, size=40).tolist()
PROMPTS = [PROMPT[:6], PROMPT[2:30]]
FAMILIES = {
    "zamba": (transformers.ZambaForCausalLM, transformers.ZambaConfig, ZAMBA),
    "recurrent_gemma": (transformers.RecurrentGemmaForCausalLM, transformers.RecurrentGemmaConfig, RECURRENT_GEMMA),
}
# The 6-token prompt samples its first token two steps before the 28-token one: two more tokens for it end both in
# the same step, so the engine compiles no one-row decode program.
GREEDY = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (18, 16)]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def hf_model(family) -> torch.nn.Module:
    """A random float32 model of the family, its biases, norms and skips moved off their init values."""
    model_class, config_class, config = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(**config)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1 or name.endswith((".D", "_bias")):
                param.add_(0.1 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def llm(hf_model, tmp_path_factory) -> LLM:
    """The model saved and loaded in float32: 16 tokens a step (the 28-token prompt prefills in three chunks beside the
    6-token one) and pages of 16 for both requests."""
    path = tmp_path_factory.mktemp("recurrent")
    hf_model.save_pretrained(path)
    return LLM(str(path), dtype="float32", max_seq_len=64, max_num_seqs=2, max_num_batched_tokens=16, num_pages=6,
               cpu_kernels=False)


def hf_greedy(model: torch.nn.Module, prompt: list[int], tokens: int) -> list[int]:
    """transformers' greedy tokens for the prompt alone."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_logits_match_hf(hf_model, llm):
    with torch.no_grad():
        expected = hf_model(torch.tensor([PROMPT])).logits[0].numpy()
    got = llm.logits(PROMPT)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_chunked_batched_engine_run_matches_each_prompt_alone_in_hf(hf_model, llm):
    """Each prompt gets transformers' greedy tokens for it alone, the 28-token one prefilled over three steps beside
    the other's prefill and decode. Prefix caching stays off (a page holds no state)."""
    expected = [hf_greedy(hf_model, p, params.max_tokens) for p, params in zip(PROMPTS, GREEDY)]
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
    assert llm.engine.config.enable_prefix_caching is False


def test_weights_hold_each_checkpoint_tensor_once(llm):
    """The loaded tree's parameters are the checkpoint's: Zamba's shared block once, not once per hybrid layer."""
    with safe_open(llm.model_dir / "model.safetensors", "numpy") as stored:
        expected = sum(math.prod(stored.get_slice(name).get_shape()) for name in stored.keys())
    assert sum(leaf.size for leaf in jax.tree.leaves(llm.weights)) == expected


def test_zamba_config_as_transformers_reads_it():
    """ZambaConfig's default pattern (layer 2, then every attn_layer_period-th from attn_layer_offset, hybrid) and
    dt rank; a non-SiLU mixer activation and an attention input other than [x, embeddings] refused by name."""
    hf = {k: v for k, v in ZAMBA.items() if k not in ("layers_block_type", "mamba_dt_rank")}
    hf |= dict(num_hidden_layers=12, architectures=["ZambaForCausalLM"])
    types = transformers.ZambaConfig(**hf).layers_block_type
    cfg = from_hf_config(hf)
    assert cfg.shared_blocks.layers == tuple(i for i, t in enumerate(types) if t == "hybrid") == (2, 7)
    assert (cfg.state_space.time_step_rank, cfg.state_space.selective_heads, cfg.head_dim) == (2, 2, 16)
    with pytest.raises(ConfigError, match="hidden_mamba_act 'gelu' is not supported for ZambaForCausalLM"):
        from_hf_config({**hf, "hidden_mamba_act": "gelu"})
    with pytest.raises(ConfigError, match="attention_hidden_size 32 is not supported for ZambaForCausalLM"):
        from_hf_config({**hf, "attention_hidden_size": 32})


def test_recurrent_gemma_config_as_transformers_reads_it():
    """block_types repeated over the layers (windows on the attention ones), half of intermediate_size, half of each
    head rotated, sqrt(hidden_size) rounded to bfloat16 as transformers' normalizer is (50.5 for 2560); a rope type
    other than default, gate blocks that do not divide lru_width and an unknown block type refused by name."""
    hf = {**RECURRENT_GEMMA, "num_hidden_layers": 5, "architectures": ["RecurrentGemmaForCausalLM"]}
    cfg = from_hf_config(hf)
    assert cfg.layer_windows == (0, 8, 0, 8, 0) and cfg.state_space.layers == (0, 2, 4)
    assert (cfg.intermediate_size, cfg.head_dim, cfg.rotary_dim, cfg.final_soft_cap) == (48, 8, 4, 30.0)
    assert from_hf_config({**hf, "hidden_size": 2560, "lru_width": 2560}).embedding_multiplier == 50.5
    with pytest.raises(ConfigError, match="rope type 'linear' is not supported for RecurrentGemmaForCausalLM"):
        from_hf_config({**hf, "rope_parameters": dict(rope_type="linear", factor=2.0, rope_theta=1e4)})
    with pytest.raises(ConfigError, match="lru_width 50 is not supported for RecurrentGemmaForCausalLM"):
        from_hf_config({**hf, "lru_width": 50})
    with pytest.raises(ConfigError, match="block_types .* is not supported"):
        from_hf_config({**hf, "block_types": ["recurrent", "mlp"]})
