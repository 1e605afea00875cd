"""EAGLE heads: loading the published layouts, the head against a PyTorch reference, and greedy
identity through `LLM` when the adaptive plan lets rows decode plainly and then draft again
(fixed-length drafting and the head's outputs against recomputation: test_engine_eagle)."""

from __future__ import annotations

import dataclasses
import json
import types

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from eagle_models import tiny_target_and_heads
from engine_knobs import DEMO, SPECULATION
from safetensors.numpy import load_file, save_file
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from jaxinfer import DEMO_EAGLE, LLM, SamplingParams, SpeculativeConfig
from jaxinfer.cache.contiguous import init_cache
from jaxinfer.checkpoint.loader import CheckpointError, load_weights
from jaxinfer.entrypoints.draft_loading import SpeculativeError
from jaxinfer.models import lm_logits
from jaxinfer.models.norms import rms_norm
from jaxinfer.speculative.eagle import (
    EagleParams,
    chained_head_step,
    eagle_params,
    head_logits,
    head_step,
    project_features,
)
from jaxinfer.speculative.eagle_checkpoint import load_eagle
from jaxinfer.speculative.mtp import mtp_logits

PROMPTS = [[5, 9, 31, 7, 200, 13], [40, 41, 42, 43, 44, 45, 46, 47, 48, 12, 3]]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
K = 3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A 3-layer tiny target (EAGLE-3 reads three of its layers), an EAGLE-1 and an EAGLE-3 head."""
    return tiny_target_and_heads(tmp_path_factory.mktemp("eagle"))


def test_eagle1_layout_loads_into_its_leaves(models):
    cfg, _ = load_weights(models["target"], jnp.float32, progress=False)
    ecfg, head = load_eagle(models[1], cfg, jnp.float32)
    raw = load_file(models[1] / "model.safetensors")
    assert (ecfg.version, ecfg.fc_bias, ecfg.feature_layers) == (1, True, ())
    assert head.layer.attn_norm is None and head.lm_head is None  # layer 0 has no input norm; the target's head
    np.testing.assert_array_equal(head.fc, raw["fc.weight"].T)
    q = raw["layers.0.self_attn.q_proj.weight"]  # [H*K, D] -> [D, H, K]
    np.testing.assert_array_equal(head.layer.wq, q.T.reshape(64, 4, 16))
    np.testing.assert_array_equal(head.layer.wo, raw["layers.0.self_attn.o_proj.weight"].T.reshape(4, 16, 64))
    np.testing.assert_array_equal(head.layer.w_down, raw["layers.0.mlp.down_proj.weight"].T)


def test_eagle3_layout_maps_its_draft_vocabulary(models):
    cfg, target = load_weights(models["target"], jnp.float32, progress=False)
    ecfg, head = load_eagle(models[3], cfg, jnp.float32)
    raw = load_file(models[3] / "model.safetensors")
    assert (ecfg.version, ecfg.draft_vocab, ecfg.feature_layers, ecfg.feature_size) == (3, 96, (0, 1, 2), 192)
    assert head.layer.wq.shape == (128, 4, 16)  # q/k/v read [embedding; feature]
    logits = head_logits(EagleParams(head, target.embed, target.lm_head), jnp.ones((2, 64)), ecfg)
    allowed = np.flatnonzero(raw["t2d"])
    np.testing.assert_array_equal(np.flatnonzero(np.isfinite(logits[0])), allowed)
    np.testing.assert_allclose(logits[0, allowed], jnp.ones(64) @ raw["lm_head.weight"].T, rtol=1e-4, atol=1e-5)


def test_a_head_reading_the_target_head_gets_its_bias_scaling_and_soft_cap(models):
    """EAGLE-1 and an MTP layer draft through the target's LM head: with the target's bias, scaling
    and soft cap (Phi's, Granite's, Gemma 2's) their logits are the target's on the same features."""
    cfg, target = load_weights(models["target"], jnp.float32, progress=False)
    ecfg, head = load_eagle(models[1], cfg, jnp.float32)
    bias = jnp.linspace(-3.0, 3.0, cfg.vocab_size)
    target = dataclasses.replace(target, lm_head_bias=bias, logits_scaling=0.5, logit_soft_cap=2.0)
    features = jnp.asarray(np.random.default_rng(0).normal(size=(2, 64)), jnp.float32)
    expected = lm_logits(target, features)
    assert float(jnp.abs(expected).max()) < 2.0 and float(jnp.std(expected)) > 0.3  # the cap and the bias show
    np.testing.assert_allclose(head_logits(eagle_params(head, target), features, ecfg), expected, rtol=1e-6)
    mtp_head = types.SimpleNamespace(norm=jnp.ones(64), lm_head=None)  # what an MTP layer's logits read of it
    normed = rms_norm(features, mtp_head.norm, cfg.rms_norm_eps)
    np.testing.assert_allclose(mtp_logits(eagle_params(mtp_head, target), features, cfg), lm_logits(target, normed),
                               rtol=1e-6)

    # A target whose head scales each token's logit (Dory's logit_scale): a head drafting from its product would
    # draft from other logits than the target's, so none is handed it.
    with pytest.raises(ValueError, match="scales each token's logit \\(Dory's logit_scale\\)"):
        eagle_params(head, dataclasses.replace(target, logit_scale=jnp.ones(cfg.vocab_size)))


def test_unusable_heads_raise_naming_the_problem(models, tmp_path):
    cfg, _ = load_weights(models["target"], jnp.float32, progress=False)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((models[1] / "config.json").read_text())
    tensors = load_file(models[1] / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if "up_proj" not in k}, broken / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing.*layers.0.mlp.up_proj.weight"):
        load_eagle(broken, cfg, jnp.float32)
    strict = SpeculativeConfig(method="eagle", draft_model=str(broken), fallback=False)
    with pytest.raises(SpeculativeError, match="cannot be used: CheckpointError: .*up_proj"):
        LLM(models["target"], speculative=strict, **SPECULATION)
    with pytest.raises(CheckpointError, match="hidden_size 64, the target 32"):
        load_eagle(models[1], dataclasses.replace(cfg, hidden_size=32), jnp.float32)
    with pytest.raises(CheckpointError, match="not an EAGLE head"):
        load_eagle(models["target"], cfg, jnp.float32)
    with pytest.raises(ValueError, match='method="eagle" needs draft_model'):
        SpeculativeConfig(method="eagle")


def test_eagle1_head_matches_pytorch_reference(models):
    """fc over [embedding; feature], then a Llama layer whose input norm is the identity (EAGLE-1's layer 0)."""
    cfg, target = load_weights(models["target"], jnp.float32, progress=False)
    ecfg, head = load_eagle(models[1], cfg, jnp.float32)
    raw = {k: torch.from_numpy(v) for k, v in load_file(models[1] / "model.safetensors").items()}
    config = transformers.LlamaConfig(**json.loads((models[1] / "config.json").read_text()))
    config._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(config, layer_idx=0).eval()
    layer.input_layernorm = torch.nn.Identity()
    layer.load_state_dict({k.removeprefix("layers.0."): v for k, v in raw.items() if k.startswith("layers.0.")})
    tokens = np.random.RandomState(0).randint(0, 256, (1, 9))
    features = np.random.RandomState(1).standard_normal((1, 9, 64)).astype(np.float32)
    with torch.no_grad():
        embeds = torch.tensor(np.asarray(target.embed))[torch.from_numpy(tokens)]
        x = torch.cat([embeds, torch.from_numpy(features)], -1) @ raw["fc.weight"].T + raw["fc.bias"]
        positions = torch.arange(9)[None]
        out = layer(x, attention_mask=None, position_ids=positions,
                    position_embeddings=LlamaRotaryEmbedding(config)(x, positions))
        expected = (out[0] if isinstance(out, tuple) else out).numpy()
    params = EagleParams(head, target.embed, target.lm_head)
    cache = init_cache(ecfg.layer, 1, 16, jnp.float32)
    got, _ = head_step(params, jnp.asarray(tokens), jnp.asarray(features), jnp.arange(9)[None], cache, ecfg)
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("version", [1, 3])
def test_chained_step_at_every_position_is_each_position_alone(models, version):
    """chained_head_step (training on the head's own outputs) gives at each position p what head_step
    gives at p alone over the same cache: attending to the entries before p and to its own key."""
    cfg, target = load_weights(models["target"], jnp.float32, progress=False)
    ecfg, head = load_eagle(models[version], cfg, jnp.float32)
    params, steps = EagleParams(head, target.embed, target.lm_head), 9
    rng = np.random.RandomState(version)
    tokens, chained_tokens = (jnp.asarray(rng.randint(0, 256, (2, steps))) for _ in range(2))
    features = jnp.asarray(rng.standard_normal((2, steps, ecfg.feature_size)).astype(np.float32))
    own = jnp.asarray(rng.standard_normal((2, steps, cfg.hidden_size)).astype(np.float32))
    positions = jnp.broadcast_to(jnp.arange(steps), (2, steps))
    _, cache = head_step(params, tokens, project_features(params, features, ecfg), positions,
                         init_cache(ecfg.layer, 2, steps, jnp.float32), ecfg)
    together = chained_head_step(params, chained_tokens, own, positions, cache, ecfg)
    for p in (0, 4, steps - 1):
        alone, _ = head_step(params, chained_tokens[:, p : p + 1], own[:, p : p + 1], positions[:, p : p + 1], cache,
                             ecfg)
        np.testing.assert_allclose(together[:, p], alone[:, 0], rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def plain(models):
    return [o.token_ids for o in LLM(models["target"], **SPECULATION).generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("version", [1, 3])
def test_heads_read_plain_steps_and_draft_again(models, plain, version):
    """Rounds priced so that only a lone running row pays: both prompts decode plainly, the head
    taking each plain step's features (EAGLE-3: three layers' worth), until the shorter one ends
    and the longer speculates; the output stays the target's."""
    spec = SpeculativeConfig(method="eagle", draft_model=str(models[version]), num_speculative_tokens=K,
                             draft_cost=0.0, verify_saturation_tokens=2, calibrate=False)
    llm = LLM(models["target"], speculative=spec, **SPECULATION)
    params = [GREEDY, dataclasses.replace(GREEDY, max_tokens=4)]
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [plain[0], plain[1][:4]]
    assert outs[0].spec_stats["spec_passes"] >= 1 and outs[1].spec_stats["spec_passes"] == 0, outs[0].spec_stats


DEMO_PROMPTS = ["def fibonacci(n):\n", "import os\n", "class Point:\n"]
DEMO_GREEDY = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def demo_plain():
    """The demo target's greedy continuations of DEMO_PROMPTS."""
    return [o.token_ids for o in LLM(**DEMO).generate(DEMO_PROMPTS, DEMO_GREEDY)]


def test_demo_head_drafts_again_after_plain_steps(demo_plain):
    """Rounds priced so that only a lone running row pays: the batch decodes plainly until the short
    requests end, then the head drafts from the features those plain steps handed it (the
    plain steps' positions are checked exactly in test_engine_eagle's
    test_head_output_at_every_position_equals_recomputation)."""
    spec = SpeculativeConfig(method="eagle", draft_model=str(DEMO_EAGLE), num_speculative_tokens=4, draft_cost=0.0,
                             verify_saturation_tokens=2, calibrate=False)
    llm = LLM(speculative=spec, **DEMO)
    short = dataclasses.replace(DEMO_GREEDY, max_tokens=12)
    outs = llm.generate(DEMO_PROMPTS, [DEMO_GREEDY, short, short])
    assert [o.token_ids for o in outs] == [demo_plain[0], demo_plain[1][:12], demo_plain[2][:12]]
    assert outs[0].spec_stats["spec_passes"] >= 1 and all(o.spec_stats["spec_passes"] == 0 for o in outs[1:])
    assert llm.metrics()["acceptance_rate"] > 0.2, llm.metrics()
