"""A model's own MTP layer (GLM-4.5's, DeepSeek-V3's) speculating inside the engine: the layer's logits
against one assembled in torch from transformers' own modules on the same weights, greedy output with
MTP drafts identical to plain decoding (k = 1 and 2, prefix caching on), and the refusals by name."""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from engine_runs import engine_ids
from hf_models import make_hf_model, save_hf_model
from mtp_models import deeper_model, save_with_mtp
from safetensors.torch import load_file

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.cache.contiguous import init_cache
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.config.model import ConfigError
from jaxinfer.entrypoints.draft_loading import SpeculativeError
from jaxinfer.models import forward_with_taps
from jaxinfer.speculative.eagle import EagleParams, head_logits, head_step
from jaxinfer.speculative.mtp_checkpoint import load_mtp

FAMILIES = ("glm4_moe", "deepseek_v3")
ENGINE_K = {"glm4_moe": 2, "deepseek_v3": 1}
# test_families' prompts and engine knobs (two prompts sharing a page, prefix caching on): its plain runs
# compiled the target's programs already.
PROMPT = np.random.RandomState(0).randint(3, 256, size=64).tolist()
PROMPTS = [PROMPT[:20] + PROMPT[40:44], PROMPT[:20] + PROMPT[50:58]]
GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
KNOBS = dict(dtype="float32", max_seq_len=128, enable_prefix_caching=True)
# test_families' filler too: the second call computes 20 of its prompts' tokens (a page of each cached); a 40-token
# prompt no page holds, sampled once, keeps that step in the first call's 64-token bucket (one ragged program an
# engine, not two), and ends there, so the prompts still decode (and draft) as two rows.
FILLER = PROMPT[24:64]
ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0)


def hf_greedy(name: str) -> list[list[int]]:
    """HF's 32 greedy tokens after each prompt: plain decoding's (test_families checks they are the engine's)."""
    model = make_hf_model(name)
    with torch.no_grad():
        outs = [model.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                               pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
    return outs


@functools.cache
def hf_next_token(name: str, prompt: tuple[int, ...]) -> int:
    """HF's greedy token after `prompt`."""
    with torch.no_grad():
        return int(make_hf_model(name)(torch.tensor([prompt])).logits[0, -1].argmax())


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """(family name, a tiny checkpoint of it holding an MTP layer that drafts the target's greedy
    continuations' next tokens, HF's greedy tokens)."""
    expected = hf_greedy(request.param)
    pairs = collections.Counter((a, b) for out in expected for a, b in zip(out, out[1:]))
    follows = {a: b for (a, b), _ in sorted(pairs.items(), key=lambda item: item[1])}  # each token's likeliest next
    path = save_with_mtp(request.param, tmp_path_factory.mktemp(f"mtp-{request.param}"), follows)
    return request.param, path, expected


def mtp_spec(k: int, **extra) -> SpeculativeConfig:
    return SpeculativeConfig(method="mtp", num_speculative_tokens=k, adaptive=False, fallback=False, **extra)


def torch_mtp_logits(name: str, model_dir, tokens: list[int]) -> np.ndarray:
    """The MTP layer's logits at positions 0..L-2 of tokens, from transformers' modules: the target's
    last layer's output (before its final norm) as h_i, the MTP decoder layer as the same HF class
    builds it one layer deeper, RMSNorm and Linear for enorm, hnorm, eh_proj and the shared head."""
    target = make_hf_model(name)
    layers = target.config.num_hidden_layers
    captured = {}
    target.model.layers[-1].register_forward_hook(lambda m, args, out: captured.update(h=out))
    ids = torch.tensor([tokens])
    with torch.no_grad():
        target(ids)
    deeper = deeper_model(name).model
    layer, rotary = deeper.layers[layers], deeper.rotary_emb
    stored = load_file(model_dir / "mtp.safetensors")
    d, eps, norm_cls = target.config.hidden_size, target.config.rms_norm_eps, type(target.model.norm)
    modules = {"enorm": norm_cls(d, eps=eps), "hnorm": norm_cls(d, eps=eps), "shared_head.norm": norm_cls(d, eps=eps),
               "eh_proj": torch.nn.Linear(2 * d, d, bias=False),
               "shared_head.head": torch.nn.Linear(d, target.config.vocab_size, bias=False)}
    for key, module in modules.items():
        module.weight.data.copy_(stored[f"model.layers.{layers}.{key}.weight"])
    length = len(tokens) - 1
    positions = torch.arange(length)[None]
    mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        embeds = target.model.embed_tokens(ids[:, 1:])
        x = modules["eh_proj"](torch.cat([modules["enorm"](embeds), modules["hnorm"](captured["h"][:, :-1])], -1))
        x = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rotary(x, positions))
        return modules["shared_head.head"](modules["shared_head.norm"](x))[0].numpy()


@functools.partial(jax.jit, static_argnames=("cfg", "ecfg"))
def mtp_logits(weights, head, tokens, cfg, ecfg):
    """jaxinfer's MTP logits at positions 0..L-2 of tokens [1, L]: the target's pre-norm states, then the layer."""
    length = tokens.shape[1]
    positions = jnp.arange(length)[None]
    _, taps, _ = forward_with_taps(weights, tokens, positions, init_cache(cfg, 1, length, jnp.float32), cfg,
                                   ecfg.feature_layers)
    params = EagleParams(head, weights.embed, weights.lm_head)
    predicted, _ = head_step(params, tokens[:, 1:], taps[0][:, :-1], positions[:, :-1],
                             init_cache(ecfg.layer, 1, length, jnp.float32), ecfg)
    return head_logits(params, predicted, ecfg)[0]


def test_mtp_logits_match_a_torch_reference(family):
    """float32: jaxinfer's MTP logits at every position of a prompt and its greedy output equal the torch
    reference's (fails if the layer reads the post-norm state, swaps the concatenation, skips a norm or the head)."""
    name, path, expected = family
    tokens = PROMPTS[1] + expected[1]
    cfg, weights = load_weights(path, jnp.float32, progress=False)
    ecfg, head = load_mtp(path, cfg, jnp.float32)
    ours = np.asarray(mtp_logits(weights, head, jnp.asarray([tokens]), cfg=cfg, ecfg=ecfg))
    reference = torch_mtp_logits(name, path, tokens)
    print(f"{name}: max |logit diff| {np.abs(ours - reference).max():.2e}")
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-4)


def test_greedy_mtp_in_engine_equals_plain(family):
    """Greedy tokens with MTP drafts are plain decoding's (HF's), twice (the second call's prompts hit the
    prefix cache), with drafts both accepted and rejected. One k per family keeps the compiles down: GLM-4.5
    chains the layer on its own output (k = 2), DeepSeek-V3 drafts one token over its latent pool (k = 1)."""
    name, path, expected = family
    k = ENGINE_K[name]
    llm = LLM(path, speculative=mtp_spec(k), **KNOBS)
    assert engine_ids(llm, PROMPTS, GREEDY) == expected
    again = engine_ids(llm, [*PROMPTS, FILLER], [GREEDY, GREEDY, ONE_TOKEN])
    assert again == [*expected, [hf_next_token(name, tuple(FILLER))]]
    metrics = llm.engine.speculation_metrics()
    print(f"{family[0]} k={k}: acceptance {metrics['acceptance_rate']:.2f} of {metrics['drafted']} drafted")
    assert metrics["method"] == "mtp" and llm.engine.draft_spec.cfg.version == "mtp"
    assert 0.2 < metrics["acceptance_rate"] < 1 and llm.metrics()["prefix_cache_hits"] > 0


def test_refusals_name_the_cause(checkpoint_dir, tmp_path):
    """A draft_model that is no Gemma 4 assistant, another architecture, a checkpoint without MTP layers (and one
    declaring a layer it does not hold, with fallback off) are refused by name; vLLM's "deepseek_mtp" is the same
    method."""
    with pytest.raises(SpeculativeError, match="runs a Gemma 4 assistant .* holds none"):
        LLM(checkpoint_dir("glm4_moe"), speculative=mtp_spec(1, draft_model=checkpoint_dir("llama3")), **KNOBS)
    assert SpeculativeConfig(method="deepseek_mtp").method == "mtp"
    with pytest.raises(ConfigError, match="not LlamaForCausalLM's"):
        LLM(checkpoint_dir("llama3"), speculative=mtp_spec(1), **KNOBS)
    none = save_hf_model("glm4_moe", tmp_path / "none", num_nextn_predict_layers=0)
    with pytest.raises(ConfigError, match="Glm4MoeForCausalLM checkpoint has num_nextn_predict_layers=0"):
        LLM(none, speculative=mtp_spec(1), **KNOBS)
    with pytest.raises(SpeculativeError, match=r"lacks \d+ of the first one's tensors.*model\.layers\.2\."):
        LLM(checkpoint_dir("glm4_moe"), speculative=mtp_spec(1), **KNOBS)


def leaves_equal(served, expected) -> bool:
    """Whether two MTP layers hold the same values, leaf by leaf."""
    return all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
               zip(jax.tree.leaves(served), jax.tree.leaves(expected), strict=True))


@pytest.mark.parametrize("family", ["glm4_moe"], indirect=True)
def test_new_weights_reach_the_mtp_layer(family, tmp_path):
    """An RL trainer's update carries the MTP layer's tensors (`model.layers.{N}.*`): update_weights puts them in
    the layer that drafts, as update_weights_from_disk does with a checkpoint's, and greedy output stays plain
    decoding's (fails if the MTP names are dropped, as they were, or the layer is kept)."""
    name, path, expected = family
    llm = LLM(path, speculative=mtp_spec(ENGINE_K[name]), **KNOBS)
    other = save_with_mtp(name, tmp_path, follows={})  # the same decoder, an MTP layer of noise
    served = lambda: llm.engine.runner.draft_weights.head  # noqa: E731
    assert not leaves_equal(served(), load_mtp(other, llm.config, jnp.float32)[1])
    llm.update_weights(load_file(other / "mtp.safetensors"))
    assert leaves_equal(served(), load_mtp(other, llm.config, jnp.float32)[1])
    assert engine_ids(llm, PROMPTS, GREEDY) == expected
    llm.update_weights_from_disk(path)
    assert leaves_equal(served(), load_mtp(path, llm.config, jnp.float32)[1])
