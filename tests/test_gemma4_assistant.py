"""Gemma 4's assistant drafter (Gemma4AssistantForCausalLM) against transformers on the same tiny saved weights and
the same target states: a draft round's logits and states step by step, with the full LM head and with ordered
embeddings (top-k centroids); assistants that do not fit the target refused by name."""

from __future__ import annotations

import dataclasses
import functools
import json
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from gemma4_assistants import make_assistant
from hf_models import make_hf_model

from jaxinfer import SamplingParams, SpeculativeConfig
from jaxinfer.cache.paged import init_paged_cache
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.config.model import ConfigError
from jaxinfer.entrypoints.draft_loading import SpeculativeError, engine_speculation
from jaxinfer.kernels.cpu.choice import kernels_available
from jaxinfer.models import forward
from jaxinfer.models.registry import from_hf_config
from jaxinfer.runtime.assistant_rider import AssistantDraft, propose, target_attention
from jaxinfer.runtime.position_pool import store_at
from jaxinfer.sampling.sampler import sampling_arrays
from jaxinfer.speculative.eagle import eagle_params
from jaxinfer.speculative.gemma4_assistant import assistant_forward, assistant_step, read_assistant_config
from jaxinfer.speculative.gemma4_assistant_checkpoint import load_assistant

PROMPT = np.random.RandomState(1).randint(3, 256, size=20).tolist()  # past the window (8) of the sliding layers
STEPS = 3
STEP = jax.jit(assistant_step, static_argnums=1)  # one program per config, not one per op
FORWARD = jax.jit(forward, static_argnums=4)


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return make_hf_model("gemma4_dense")


@pytest.fixture(scope="module")
def target_states(target) -> tuple[torch.Tensor, dict]:
    """The target over the prompt: its post-norm hidden state before the last token and the K/V it shares (the
    last token's too: a paged cache holds keys at and past the drafting position, which the assistant must not
    read; HF's candidate generator hands it those before it only, as here)."""
    with torch.no_grad():
        out = target(torch.tensor([PROMPT]), output_hidden_states=True, return_shared_kv_states=True)
    return out.hidden_states[-1][:, -2:-1], out.shared_kv_states


def hf_round(assistant, target, target_states) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """HF's draft round as its candidate generator runs it: (logits, next state, token drafted) per step."""
    state, shared = target_states
    shared = {kind: (k[:, :, :-1], v[:, :, :-1]) for kind, (k, v) in shared.items()}
    token, position = torch.tensor([[PROMPT[-1]]]), torch.tensor([[len(PROMPT) - 1]])
    steps = []
    with torch.no_grad():
        for _ in range(STEPS):
            embeds = torch.cat([target.get_input_embeddings()(token), state], dim=-1)
            out = assistant(inputs_embeds=embeds, position_ids=position, shared_kv_states=shared)
            token, state = out.logits.argmax(-1), out.last_hidden_state
            steps.append((out.logits[0, 0].numpy(), state[0, 0].numpy(), int(token)))
    return steps


@pytest.mark.parametrize("ordered", [False, True], ids=["lm_head", "ordered_embeddings"])
def test_draft_round_matches_hf(ordered, target, target_states, tmp_path):
    """Three chained draft steps at one position over the target's sliding (past its window) and full K/V: the
    logits (all of them, or the top-k centroids' tokens and the fill elsewhere) and the next states."""
    assistant = make_assistant(ordered)
    assistant.save_pretrained(tmp_path)
    target_cfg = from_hf_config(target.config.to_dict() | {"architectures": ["Gemma4ForCausalLM"]})
    acfg, weights = load_assistant(tmp_path, target_cfg, jnp.float32)
    shared = target_states[1]
    kinds = {i: "sliding_attention" if acfg.layers.layer_windows[i] else "full_attention" for i in acfg.reads}
    kv = [(jnp.asarray(shared[k][0].numpy()), jnp.asarray(shared[k][1].numpy()).transpose(0, 1, 3, 2))
          for k in (kinds[i] for i in acfg.reads)]
    embed = jnp.asarray(target.get_input_embeddings().weight.detach().numpy())
    _check_round(hf_round(assistant, target, target_states), acfg, weights, embed,
                 jnp.asarray(target_states[0][:, 0].numpy()), kv)


def test_draft_round_on_jaxinfer_target_states(target, target_states, checkpoint_dir, tmp_path):
    """The same round read from jaxinfer's own Gemma 4 forward, as the engine's rider reads it: its post-norm state at
    P - 1 and the K/V of the layers `AssistantConfig.reads` names in page pools of 4 positions under a shuffled page
    table (`target_attention`: the keys before P, a sliding layer's last window + 1), HF's logits; and the rider's
    greedy round (`propose`) drafts HF's tokens."""
    assistant = make_assistant(False)
    assistant.save_pretrained(tmp_path)
    target_dir = checkpoint_dir("gemma4_dense")
    target_cfg, target_weights = load_weights(target_dir, jnp.float32, progress=False)
    acfg, weights = load_assistant(tmp_path, target_cfg, jnp.float32)
    table = np.asarray([[5, 2, 0, 4, 1, 3]], np.int32)  # 24 positions
    hidden, pages = FORWARD(target_weights, jnp.asarray([PROMPT]), jnp.arange(len(PROMPT))[None], init_paged_cache(
        target_cfg, 1, 24, jnp.float32, page_size=4, page_table=table), target_cfg)
    expected = hf_round(assistant, target, target_states)
    _check_round(expected, acfg, weights, target_weights.embed, hidden[:, -2], None,
                 functools.partial(PAGED_STEP, pages=pages))
    # The rider's whole greedy round from the engine's pools: the state at P - 1 from its pool of the target's
    # states under the same table, t_P from the verify chunk's first slot, every step at P; its attention on the
    # native CPU kernel the engine's pools take by default (where it runs), the blocked path above.
    pages = dataclasses.replace(pages, cpu_kernels=kernels_available())
    drafted = ROUND(acfg, eagle_params(weights, target_weights), pages, table, hidden[0])
    assert np.asarray(drafted).tolist() == [[token for _, _, token in expected]]


@functools.partial(jax.jit, static_argnums=0)
def ROUND(acfg, params, pages, table, hidden) -> jax.Array:  # noqa: N802 - one program per config
    """assistant_rider.propose's STEPS greedy drafts of one row whose verify chunk [t_P, placeholders] sits at P,
    the target's states hidden [L, B] stored in the rider's pool first."""
    chunk = STEPS + 1
    features = store_at(jnp.zeros((6, 4, acfg.backbone_hidden_size)), jnp.asarray(table)[jnp.zeros(len(PROMPT), int)],
                        jnp.arange(len(PROMPT)), hidden)
    draft = AssistantDraft(features, acfg, "float32")
    x = SimpleNamespace(lengths=jnp.asarray([len(PROMPT) - 1 + chunk]), query_lens=jnp.asarray([chunk]),
                        tokens=jnp.asarray([PROMPT[-1]] + [0] * STEPS), page_table=jnp.asarray(table),
                        sampling=SimpleNamespace(params=sampling_arrays([SamplingParams(temperature=0)], [0])))
    return propose(draft, params, pages, x, jnp.asarray([STEPS]))[0]


@functools.partial(jax.jit, static_argnums=1)
def PAGED_STEP(weights, acfg, embed, token, state, position, kv, pages):  # noqa: N802 - STEP's paged twin
    """assistant_forward over the target's pages as runtime/assistant_rider reads them (one row, live)."""
    attend = target_attention(SimpleNamespace(acfg=acfg), pages, SimpleNamespace(page_table=pages.page_table),
                              position, jnp.ones_like(position, bool))
    return assistant_forward(weights, acfg, embed, token, state, position, attend)


def _check_round(expected: list, acfg, weights, embed: jax.Array, state: jax.Array, kv: list | None,
                 step=STEP) -> None:
    """assistant_step (or `step`) chained from (the last prompt token, state) matches HF's round step by step."""
    token, position = jnp.asarray([PROMPT[-1]]), jnp.asarray([len(PROMPT) - 1])
    for logits_hf, state_hf, token_hf in expected:
        state, logits = step(weights, acfg, embed, token, state, position, kv)
        assert float(np.abs(np.asarray(logits[0]) - logits_hf).max()) <= 1e-5
        assert float(np.abs(np.asarray(state[0]) - state_hf).max()) <= 1e-5
        token = jnp.argmax(logits, axis=-1)
        assert int(token[0]) == token_hf


@pytest.mark.parametrize("field,value,named", [
    ("backbone_hidden_size", 48, "backbone_hidden_size 48"),
    ("vocab_size", 512, "vocab_size 512"),
    ("head_dim", 16, "(kv heads, head dim) (2, 16)"),
])
def test_mismatched_assistant_refused_by_name(field, value, named, target):
    """An assistant trained for another target: its width, vocabulary or K/V shapes named in the error."""
    config = json.loads(make_assistant(False).config.to_json_string())
    config["architectures"] = ["Gemma4AssistantForCausalLM"]
    if field in config["text_config"]:
        config["text_config"][field] = value
    else:
        config[field] = value
    target_cfg = from_hf_config(target.config.to_dict() | {"architectures": ["Gemma4ForCausalLM"]})
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
        read_assistant_config(config, target_cfg)


@pytest.mark.parametrize("backbone,named", [(64, 'use method="mtp" with draft_model='),
                                            (48, "backbone_hidden_size 48")], ids=["fits", "mismatched"])
def test_engine_refuses_assistant_as_draft_model_by_name(backbone, named, target, tmp_path):
    """As a draft model (its drafts need the target's K/V, which method "mtp" hands it) an assistant is refused by
    name with the method that runs it, not read as an unknown architecture; one trained for another target is
    refused for that."""
    assistant = make_assistant(False)
    assistant.config.backbone_hidden_size = backbone
    assistant.save_pretrained(tmp_path)
    target_cfg = from_hf_config(target.config.to_dict() | {"architectures": ["Gemma4ForCausalLM"]})
    config = SpeculativeConfig(method="draft", draft_model=str(tmp_path), fallback=False)
    with pytest.raises(SpeculativeError, match=named):
        engine_speculation(config, target_cfg, None, None, jnp.float32, 64)


def test_engine_refuses_assistant_on_a_mesh_by_name(tmp_path, target):
    """Its reads of a target's pages split over devices are not written yet: an engine on a mesh is refused by name
    (before anything loads), not run untested."""
    make_assistant(False).save_pretrained(tmp_path)
    target_cfg = from_hf_config(target.config.to_dict() | {"architectures": ["Gemma4ForCausalLM"]})
    config = SpeculativeConfig(method="mtp", draft_model=str(tmp_path), fallback=False)
    with pytest.raises(SpeculativeError, match="drafts on one device; this engine spans a mesh of 4"):
        engine_speculation(config, target_cfg, None, None, jnp.float32, 64, layout=SimpleNamespace(size=4))
