"""HY-V4 and hyper-connections beyond test_hf_parity's float32 logits of hy_v4: the engine's greedy tokens through
chunked prefill (the streams and the shared layers' choice live inside a step only), DeepSeek-V4's mixing
(Sinkhorn) form against transformers' module, the released tensor names and the settings refused by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from engine_knobs import ENGINE
from hf_models import ARCH_CONFIGS, hf, make_hf_model, save_hf_model

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.hyper_connections import HyperConnections
from jaxinfer.config.model import ConfigError
from jaxinfer.models.decoder import forward_with_taps
from jaxinfer.models.hy_v4 import stored_names
from jaxinfer.models.hyper_connections import around
from jaxinfer.models.registry import from_hf_config

PROMPT = np.random.RandomState(0).randint(3, 256, size=64).tolist()
# 48-token prompts prefilled in 32-token steps, the two rows then decoding together: every query past the 8th
# attends 8 of its keys, the shared layer those its full layer chose in the same step.
PROMPTS = [PROMPT[:48], PROMPT[:40] + PROMPT[50:58]]
# One dense layer: expanding, gating and collapsing the streams in every step program (the shared layers' reading
# of the choice is test_hf_parity's; a second layer would compile the step programs' MoE and shared forms, +6 s).
ONE_LAYER = dict(num_hidden_layers=1)


def test_engine_greedy_matches_hf_through_chunked_prefill(tmp_path):
    """Two 48-token prompts through the engine's 32-token steps, then decoding together: HF's greedy tokens, each
    with HF's log-probability (the tokens alone barely move when the streams are collapsed wrongly)."""
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=1)
    llm = LLM(save_hf_model("hy_v4", tmp_path, **ONE_LAYER), **ENGINE)
    outs = [o.outputs[0] for o in llm.generate(PROMPTS, params)]
    with torch.no_grad():  # the prompts are as long: one batch, no padding
        logits = make_hf_model("hy_v4", **ONE_LAYER)(torch.tensor([p + o.token_ids for p, o in zip(PROMPTS, outs)]))
    expected = torch.log_softmax(logits.logits, -1).numpy()[:, len(PROMPTS[0]) - 1 : -1]
    for out, rows in zip(outs, expected):
        assert out.token_ids == rows.argmax(-1).tolist()
        got = [step[t].logprob for step, t in zip(out.logprobs, out.token_ids)]
        np.testing.assert_allclose(got, rows[np.arange(8), out.token_ids], atol=1e-4)


def test_mixing_form_matches_deepseek_v4_hyper_connection():
    """mHC (DeepSeek-V4's, GLM-5.3's): read gate, write gate (2 sigmoid, no eps) and the Sinkhorn-mixed streams as
    transformers' DeepseekV4HyperConnection computes them around a sublayer, to float32 rounding."""
    config = hf.DeepseekV4Config(hidden_size=16, hc_mult=3, hc_sinkhorn_iters=5, hc_eps=1e-6, rms_norm_eps=1e-5)
    module = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4").DeepseekV4HyperConnection(
        config)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn_like(param))
        streams = torch.randn(2, 5, 3, 16)
        post, comb, collapsed = module(streams)
        expected = post[..., None] * torch.tanh(collapsed)[..., None, :] + comb.transpose(-1, -2) @ streams
    hc = HyperConnections(mult=3, eps=1e-6, norm_eps=1e-5, post_scale=2.0, post_eps=False, sinkhorn_iters=5)
    fn, base, scale = (jnp.asarray(p.detach().numpy()) for p in (module.fn.T, module.base, module.scale))
    got = jax.jit(lambda *args: around(*args, hc, jnp.tanh))(jnp.asarray(streams.numpy()), fn, base, scale)
    assert np.abs(np.asarray(got) - expected.numpy()).max() <= 1e-5 * np.abs(expected.numpy()).max()


def test_released_mlp_names_are_read_as_they_are():
    """transformers saves the MLPs' gate_proj as linear_gate: such a checkpoint's names map back; the released
    names (gate_proj) are read as named."""
    saved = ["model.layers.0.mlp.linear_gate.weight", "model.layers.1.mlp.shared_experts.linear_gate.weight",
             "model.layers.0.self_attn.linear_gate.weight"]
    assert stored_names(saved) == {"model.layers.0.mlp.gate_proj.weight": saved[0],
                                   "model.layers.1.mlp.shared_experts.gate_proj.weight": saved[1],
                                   saved[2]: saved[2]}
    assert stored_names(["model.layers.0.mlp.gate_proj.weight", saved[2]]) == {}


def _hf_config(**overrides) -> dict:
    config_cls, fields = ARCH_CONFIGS["hy_v4"]
    return {**config_cls(**fields).to_dict(), "architectures": ["HYV4ForCausalLM"], **overrides}


@pytest.mark.parametrize("overrides, named", [
    (dict(indexer_types=["shared", "full", "shared"]), "indexer_types"),
    (dict(indexer_types=["full", "full"]), "indexer_types"),
    (dict(layer_types=["indexed_attention", "full_attention", "indexed_attention"]), "layer_types"),
    (dict(swiglu_limit=0.0), "swiglu_limit"),
])
def test_unsupported_settings_are_refused_by_name(overrides, named):
    with pytest.raises(ConfigError, match=named):
        from_hf_config(_hf_config(**overrides))


def test_hidden_state_taps_are_refused_by_name():
    """EAGLE-3 heads and MTP drafts read one residual stream; HY-V4 has several: refused before anything runs."""
    with pytest.raises(ValueError, match="hidden-state taps .* not supported for HYV4ForCausalLM"):
        forward_with_taps(None, None, None, None, from_hf_config(_hf_config()), (0,))
