"""GPT-2 beyond test_hf_parity's family runs: decode steps read their own positions' rows, the position table
bounds the context, the hub's file layout loads, and the config settings not run are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_models import make_hf_model
from safetensors.numpy import load_file, save_file

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import from_hf_config

N_POSITIONS = 512  # hf_models' tiny "gpt2": COMMON's max_position_embeddings is its n_positions
PROMPT = list(range(3, 19))


@pytest.fixture(scope="module")
def gpt2_dir(checkpoint_dir):
    return checkpoint_dir("gpt2")


@pytest.fixture(scope="module")
def llm(gpt2_dir) -> LLM:
    """test_hf_parity's greedy XLA run's knobs, so its programs serve here too."""
    return LLM(gpt2_dir, dtype="float32", max_seq_len=128, cpu_kernels=False)


def test_decode_steps_read_their_positions_rows(llm):
    """Greedy decoding picks HF's argmax at each step, with its log-probability (test_hf_parity leaves GPT-2's
    greedy run to this test): a step gathers its token's own row of wpe (a slice from row 0 would not)."""
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=1)
    out = llm.generate([PROMPT], params)[0].outputs[0]
    with torch.no_grad():
        logits = make_hf_model("gpt2")(torch.tensor([PROMPT + out.token_ids])).logits[0]
    expected = torch.log_softmax(logits, -1).numpy()[len(PROMPT) - 1 : -1]
    got = [step[t].logprob for step, t in zip(out.logprobs, out.token_ids)]
    assert out.token_ids == expected.argmax(-1).tolist()
    np.testing.assert_allclose(got, expected[np.arange(8), out.token_ids], atol=1e-4)


def test_requests_past_the_position_table_are_refused(gpt2_dir):
    with pytest.raises(ValueError, match=f"max_seq_len {N_POSITIONS + 1} exceeds the model's max_position_embeddings "
                                         f"{N_POSITIONS}"):
        LLM(gpt2_dir, dtype="float32", max_seq_len=N_POSITIONS + 1)
    llm = LLM(gpt2_dir, dtype="float32", cpu_kernels=False)  # nothing compiles: every request below is refused
    assert llm.max_seq_len == N_POSITIONS  # the default: the table's length
    with pytest.raises(ValueError, match=f"exceeds max_seq_len {N_POSITIONS}"):
        llm.generate([[5] * (N_POSITIONS - 4)], SamplingParams(max_tokens=8))
    with pytest.raises(ValueError, match=f"exceeds max_seq_len {N_POSITIONS}"):
        llm.logits([5] * (N_POSITIONS + 1))


def test_hub_layout_loads_the_same_weights(gpt2_dir, llm, tmp_path):
    """The hub's gpt2 files: names without `transformer.` and each layer's causal-mask buffer `attn.bias`."""
    tensors = load_file(gpt2_dir / "model.safetensors")
    hub = {name.removeprefix("transformer."): t for name, t in tensors.items()}
    hub["h.0.attn.bias"] = np.tril(np.ones((1, 1, 8, 8), np.float32))
    save_file(hub, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((gpt2_dir / "config.json").read_text())
    hub_llm = LLM(tmp_path, dtype="float32", max_seq_len=128, cpu_kernels=False)
    np.testing.assert_array_equal(hub_llm.logits(PROMPT), llm.logits(PROMPT))


@pytest.mark.parametrize("name", ["scale_attn_by_inverse_layer_idx", "add_cross_attention"])
def test_settings_not_run_are_refused_by_name(name):
    hf = dict(architectures=["GPT2LMHeadModel"], vocab_size=256, n_embd=64, n_layer=2, n_head=4)
    assert from_hf_config(hf).attn_scale is None  # head_dim ** -0.5
    assert from_hf_config({**hf, "scale_attn_weights": False}).attn_scale == 1.0
    with pytest.raises(ConfigError, match=f"{name}=True is not supported for GPT2LMHeadModel"):
        from_hf_config({**hf, name: True})
