"""Checkpoint formats: sharded safetensors, half-precision files, orbax conversion."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_models import make_hf_model

from jaxinfer import LLM, SamplingParams, save_converted
from jaxinfer.checkpoint import loader
from jaxinfer.checkpoint.converted import restore_converted
from jaxinfer.checkpoint.leaf_paths import leaf_paths
from jaxinfer.checkpoint.loader import load_hf_weights
from jaxinfer.entrypoints.cli import main as cli_main
from jaxinfer.entrypoints.llm import DEMO_MODEL
from jaxinfer.models.registry import load_config

PROMPT = list(range(3, 40))


def test_sharded_checkpoint_loads(tmp_path, checkpoint_dir):
    make_hf_model("qwen2").save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    sharded = LLM(tmp_path, dtype="float32").logits(PROMPT)
    single = LLM(checkpoint_dir("qwen2"), dtype="float32").logits(PROMPT)
    np.testing.assert_array_equal(sharded, single)


@pytest.mark.parametrize("arch", ["gemma", "qwen3"])  # tied head, per-head norms; both have every transposed leaf kind
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_transform_on_device_loads_the_same_bits(checkpoint_dir, monkeypatch, arch, dtype):
    """The accelerator load path (tensors moved as stored, transposed and cast there) == the host path."""
    cfg_dir = checkpoint_dir(arch)
    cfg = load_config(cfg_dir)
    host = load_hf_weights(cfg_dir, cfg, dtype, progress=False)
    monkeypatch.setattr(loader, "transform_on_device", lambda: True)
    device = load_hf_weights(cfg_dir, cfg, dtype, progress=False)
    for (path, a), (_, b) in zip(leaf_paths(host), leaf_paths(device)):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=path)


def test_fp16_and_bf16_files_load_bit_exact(tmp_path):
    hf = make_hf_model("llama2")
    for dtype in (torch.float16, torch.bfloat16):
        path = tmp_path / str(dtype)
        hf.to(dtype).save_pretrained(path)
        llm = LLM(path, dtype="auto")
        name = str(dtype).removeprefix("torch.")
        assert all(str(leaf.dtype) == name for leaf in jax.tree.leaves(llm.weights))
        # The stored half-precision values arrive unchanged (no round trip through another dtype).
        expected = hf.model.layers[1].mlp.down_proj.weight.detach().float().numpy().T
        np.testing.assert_array_equal(np.asarray(llm.weights.layers[1].w_down, np.float32), expected)
        params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        greedy = llm.generate([PROMPT], params)[0].token_ids
        assert greedy == [int(np.argmax(llm.logits(PROMPT)[-1]))] + greedy[1:] and len(greedy) == 4


def test_saved_llm_weights_restore_to_the_same_model(tmp_path):
    """bf16 on CPU runs packed weights; what the user saves must still be the model's own."""
    llm = LLM(dtype="bfloat16", max_seq_len=64)
    out = save_converted(llm.weights, DEMO_MODEL, tmp_path / "saved")
    restored = restore_converted(out, llm.config, np.dtype("bfloat16"))
    original = load_hf_weights(DEMO_MODEL, llm.config, np.dtype("bfloat16"), progress=False)
    got, expected = dict(leaf_paths(restored)), dict(leaf_paths(original))
    assert got.keys() == expected.keys()
    for path, leaf in expected.items():
        np.testing.assert_array_equal(np.asarray(got[path]), np.asarray(leaf), err_msg=path)
    np.testing.assert_array_equal(LLM(out, dtype="bfloat16", max_seq_len=64).logits(PROMPT), llm.logits(PROMPT))


def test_convert_roundtrip_gives_identical_logits(tmp_path, text_model_dir):
    out = tmp_path / "converted"
    assert cli_main(["convert", str(text_model_dir), str(out), "--dtype", "float32"]) == 0
    assert (out / "tokenizer.json").is_file() and (out / "config.json").is_file()
    # At the text model's usual 128 positions: its step programs are other files' (test_generate's, the server's).
    converted = LLM(out, dtype="float32", max_seq_len=128)
    original = LLM(text_model_dir, dtype="float32", max_seq_len=128)
    np.testing.assert_array_equal(converted.logits(PROMPT), original.logits(PROMPT))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    assert converted.generate("def f", params)[0].text == original.generate("def f", params)[0].text


@pytest.mark.parametrize("flag, stored", [("float32", "float32"), ("bf16", "bfloat16"), ("float16", "float16")])
def test_convert_restores_the_stored_dtype_under_auto(tmp_path, text_model_dir, capsys, flag, stored):
    out = tmp_path / "converted"
    assert cli_main(["convert", str(text_model_dir), str(out), "--dtype", flag]) == 0
    assert capsys.readouterr().out.strip().endswith(f", {stored})")  # what is printed is what was written
    assert json.loads((out / "config.json").read_text())["dtype"] == stored
    converted = LLM(out, dtype="auto")
    assert jnp.dtype(converted.dtype).name == stored
    assert {jnp.dtype(leaf.dtype).name for leaf in jax.tree.leaves(converted.weights)} == {stored}
    original = LLM(text_model_dir, dtype=stored)
    np.testing.assert_array_equal(converted.logits(PROMPT), original.logits(PROMPT))
