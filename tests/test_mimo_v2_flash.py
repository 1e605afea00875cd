"""MiMo-V2-Flash beyond test_hf_parity's logits: decode steps over the sliding layer's window and sinks pick HF's
argmax, the config's fields read as transformers reads them, what is not run is refused by name, and the MTP
module's tensors are skipped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_models import make_hf_model

from jaxinfer import LLM, SamplingParams
from jaxinfer.checkpoint.hf_names import in_mtp_layer
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import from_hf_config

PROMPT = np.random.RandomState(0).randint(3, 256, size=12).tolist()  # test_hf_parity's greedy prompt
HF = dict(architectures=["MiMoV2FlashForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
          num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2, head_dim=32, v_head_dim=16,
          n_routed_experts=8, moe_intermediate_size=32)


def test_decode_steps_pick_hf_argmax(checkpoint_dir):
    """32 greedy steps (past the 8-token window: the sliding layer's pages and sinks read in decode) pick HF's
    argmax over the prompt and the tokens so far (test_hf_parity leaves the greedy run here: one HF forward, not
    a 32-step HF generate)."""
    llm = LLM(checkpoint_dir("mimo_v2_flash"), dtype="float32", max_seq_len=128, cpu_kernels=False)
    out = llm.generate([PROMPT], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))[0]
    tokens = out.outputs[0].token_ids
    with torch.no_grad():
        logits = make_hf_model("mimo_v2_flash")(torch.tensor([PROMPT + tokens])).logits[0]
    assert tokens == logits[len(PROMPT) - 1 : -1].argmax(-1).tolist()


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


@pytest.mark.parametrize("change, message", [
    (dict(attention_bias=True), "attention_bias=True is not supported for MiMoV2FlashForCausalLM"),
    (dict(layer_types=["full_attention"] * 6), r"layer_types \[.*\] must list one of"),
    (dict(mlp_layer_types=["dense"] * 6 + ["shared"]), r"mlp_layer_types \[.*\] must list one of"),
    (dict(rope_parameters={"full_attention": dict(rope_theta=5e6, partial_rotary_factor=0.5),
                           "sliding_attention": dict(rope_theta=1e4, partial_rotary_factor=0.334)}),
     r"partial_rotary_factor \[0.334, 0.5\] is not supported: one factor"),
])
def test_settings_not_run_are_refused_by_name(change, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**HF, **change})
