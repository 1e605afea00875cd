"""DeepSeek-V4 beyond test_hf_parity's float32 logits of deepseek_v4: the engine's greedy tokens through chunked
prefill that splits compression blocks and decodes across block ends (the compressed entries live in the pages as
token rows), the config as transformers reads it (legacy names too), the release's tensor names and the settings
refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_knobs import ENGINE
from hf_models import ARCH_CONFIGS, make_hf_model, save_hf_model

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.deepseek_v4 import CSA, HCA, SLIDING
from jaxinfer.config.model import ConfigError
from jaxinfer.entrypoints.state_settings import check_row_pages
from jaxinfer.models.deepseek_v4 import stored_names
from jaxinfer.models.registry import from_hf_config
from jaxinfer.speculative.mtp import check_mtp_target

PROMPT = np.random.RandomState(0).randint(3, 256, size=64).tolist()
# One 32-token step holds A's 14 tokens and B's first 18: B's chunk ends inside a CSA block (16..19), which its next
# chunk completes from the rows the first one wrote. Then 8 decode steps each, crossing block ends (A's 15 and 19,
# B's 47 and 51) in the same steps: two sequences pool an entry in one decode step.
PROMPTS = [PROMPT[:14], PROMPT[10:57]]
STEPS = 8
# One CSA layer (its overlapping blocks and indexer hold everything HCA's do) with hash-routed experts: the engine's
# step programs compile each distinct layer once, and every kind's forward is test_hf_parity's (3 layers: +~15 s).
ONE_LAYER = dict(num_hidden_layers=1, layer_types=["compressed_sparse_attention"], mlp_layer_types=["hash_moe"])
# One decode step a call: decode rows run ragged_step's forward, the one multi_decode loops over (the same ragged
# view of the pages); its two programs would add ~9 s of compiling from a cold cache.
KNOBS = {**ENGINE, "decode_steps": 1}


def test_engine_greedy_matches_hf_generate_through_split_blocks(tmp_path):
    """Two prompts through the engine's 32-token steps (B's first chunk ends mid-block), then decoding together:
    HF generate's greedy tokens (its own compressor caches), each with HF's log-probability from one forward over
    the whole sequence."""
    params = SamplingParams(max_tokens=STEPS, temperature=0, ignore_eos=True, logprobs=1)
    llm = LLM(save_hf_model("deepseek_v4", tmp_path, **ONE_LAYER), **KNOBS)
    outs = [o.outputs[0] for o in llm.generate(PROMPTS, params)]
    model = make_hf_model("deepseek_v4", **ONE_LAYER)
    for prompt, out in zip(PROMPTS, outs):
        with torch.no_grad():
            tokens = model.generate(torch.tensor([prompt]), max_new_tokens=STEPS, do_sample=False, eos_token_id=None,
                                    pad_token_id=0)[0, len(prompt):].tolist()
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
        assert out.token_ids == tokens
        expected = torch.log_softmax(logits, -1).numpy()[np.arange(STEPS), tokens]
        got = [step[t].logprob for step, t in zip(out.logprobs, out.token_ids)]
        np.testing.assert_allclose(got, expected, atol=1e-4)


def _hf_config(**overrides) -> dict:
    config_cls, fields = ARCH_CONFIGS["deepseek_v4"]
    return {**config_cls(**fields).to_dict(), "architectures": ["DeepseekV4ForCausalLM"], **overrides}


def test_legacy_names_are_read_as_transformers_reads_them():
    """compress_ratios (per layer, 0 / 4 / 128), num_hash_layers and qk_rope_head_dim, as checkpoints ship them."""
    legacy = {k: v for k, v in _hf_config().items()
              if k not in ("layer_types", "mlp_layer_types", "compress_rates", "partial_rotary_factor",
                           "rope_parameters")}
    yarn = dict(type="yarn", factor=16, original_max_position_embeddings=64)
    cfg = from_hf_config({**legacy, "compress_ratios": [4, 128, 0, 4], "num_hash_layers": 2, "qk_rope_head_dim": 16,
                          "rope_scaling": yarn, "rope_theta": 1e4, "compress_rope_theta": 16e4})
    fields = cfg.deepseek_v4
    assert fields.layer_kinds == (CSA, HCA, SLIDING) and fields.hash_layers == (0, 1)
    assert (fields.csa_rate, fields.hca_rate, cfg.rotary_dim) == (4, 128, 16)
    # the compress rope (the model's) YaRN-scaled with cos and sin unscaled; the sliding layers' main rope plain
    assert (cfg.rope_theta, cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == (16e4, "yarn", 16)
    assert cfg.rope_scaling.attention_factor == 1.0 and cfg.local_rope_theta == 1e4


def test_release_names_map_to_the_saved_ones():
    """DeepSeek's release stores the same names without `model.` (and embed / norm / hc_head_fn at the top)."""
    names = ["embed.weight", "norm.weight", "hc_head_fn", "layers.0.attn.wq_a.weight"]
    mapped = stored_names(names)
    assert mapped["model.layers.0.attn.wq_a.weight"] == "layers.0.attn.wq_a.weight"
    assert mapped["model.embed_tokens.weight"] == "embed.weight" and mapped["model.hc_head.hc_fn"] == "hc_head_fn"
    assert stored_names(["model.embed_tokens.weight", "model.layers.0.attn.wq_a.weight"]) == {}


@pytest.mark.parametrize("overrides, named", [
    (dict(scoring_func="softmax"), "scoring_func"),
    (dict(layer_types=["compressed_sparse_attention", "full_attention", "sliding_attention"]), "layer_types"),
    (dict(mlp_layer_types=["moe", "dense", "moe"]), "mlp_layer_types"),
    (dict(o_groups=3), "o_groups"),
    (dict(n_shared_experts=2), "n_shared_experts"),
    (dict(partial_rotary_factor=0.75), "partial_rotary_factor"),
    (dict(compress_rates={"compressed_sparse_attention": 0, "heavily_compressed_attention": 8}), "compress_rates"),
    (dict(hidden_act="gelu"), "hidden_act"),
])
def test_unsupported_settings_are_refused_by_name(overrides, named):
    with pytest.raises(ConfigError, match=named):
        from_hf_config(_hf_config(**overrides))


def test_quantized_pages_and_mtp_drafts_are_refused_by_name():
    """Its pages hold the compressors' raw inputs and entries (read back as values): int8 / fp8 pages refused; its
    MTP layers are not read, so method "mtp" is refused naming the architectures it runs."""
    cfg = from_hf_config(_hf_config())
    with pytest.raises(ConfigError, match="kv_cache_dtype 'int8' is not supported for DeepseekV4ForCausalLM"):
        check_row_pages("int8", cfg)
    with pytest.raises(ConfigError, match="not DeepseekV4ForCausalLM's"):
        check_mtp_target(cfg)
