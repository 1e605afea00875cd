"""Bad input gets a clear error that says what was wrong."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxinfer import LLM, CheckpointError, ConfigError, SamplingParams, from_hf_config


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _rewrite_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_unsupported_architecture_names_supported_ones(checkpoint_dir, tmp_path):
    path = _copy(checkpoint_dir("llama2"), tmp_path / "m")
    _rewrite_config(path, architectures=["RwkvForCausalLM"])
    with pytest.raises(ConfigError, match="RwkvForCausalLM.*supported: LlamaForCausalLM"):
        LLM(path)


def test_unsupported_rope_type_is_named():
    cfg = dict(architectures=["LlamaForCausalLM"], vocab_size=8, hidden_size=8, intermediate_size=8,
               num_hidden_layers=1, num_attention_heads=2, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ConfigError, match="rope type 'dynamic'.*supported: default, linear, llama3, longrope, yarn"):
        from_hf_config(cfg)


def test_missing_tensor_is_named(checkpoint_dir, tmp_path):
    path = _copy(checkpoint_dir("llama2"), tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing 1 tensor.*model\.layers\.1\.mlp\.up_proj\.weight"):
        LLM(path)


def test_wrong_shape_names_tensor_shapes_and_file(checkpoint_dir, tmp_path):
    path = _copy(checkpoint_dir("llama2"), tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((16, 64), np.float32)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(
        CheckpointError,
        match=r"model\.layers\.0\.self_attn\.k_proj\.weight in model\.safetensors has shape \(16, 64\), expected \(32, 64\)",
    ):
        LLM(path)


def test_unexpected_tensor_is_named(checkpoint_dir, tmp_path):
    path = _copy(checkpoint_dir("llama2"), tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.extra.weight"] = np.zeros((2,), np.float32)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.extra\.weight"):
        LLM(path)


def test_corrupted_file_is_a_checkpoint_error_naming_it(checkpoint_dir, tmp_path):
    path = _copy(checkpoint_dir("llama2"), tmp_path / "m")
    (path / "model.safetensors").write_bytes(b"\x08" + bytes(7) + b'{"a":1}')  # a header that is not one
    with pytest.raises(CheckpointError, match=r"model\.safetensors cannot be read \(.*header.*\); expected a complete"):
        LLM(path)


def test_sharded_index_naming_an_absent_shard(checkpoint_dir, tmp_path):
    path = _copy(checkpoint_dir("llama2"), tmp_path / "m")
    names = load_file(path / "model.safetensors")
    weight_map = {name: "model-00002-of-00002.safetensors" for name in names}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=r"index\.json lists 1 file\(s\) not in .*model-00002-of-00002"):
        LLM(path)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.5), "temperature must be >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(max_tokens=0), "max_tokens must be an integer >= 1"),
        (dict(top_k=-3), r"top_k must be an integer in \[-1, "),
        (dict(min_p=2.0), r"min_p must be in \[0, 1\]"),
    ],
)
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_over_long_prompt_says_what_to_change(checkpoint_dir):
    llm = LLM(checkpoint_dir("llama2"), dtype="float32", max_seq_len=64)
    with pytest.raises(ValueError, match=r"prompt \(60 tokens\) \+ max_tokens \(10\) exceeds max_seq_len 64"):
        llm.generate([[5] * 60], SamplingParams(max_tokens=10))
    ok = llm.generate([[5] * 10], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(ok[0].token_ids) == 4  # the engine is still usable after the bad request


def test_bad_token_ids_and_empty_prompt(checkpoint_dir):
    llm = LLM(checkpoint_dir("llama2"), dtype="float32", max_seq_len=64)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[5, 9999]])
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([[]])


def test_text_prompt_without_tokenizer(checkpoint_dir):
    llm = LLM(checkpoint_dir("llama2"), dtype="float32", max_seq_len=64)
    with pytest.raises(ValueError, match="no tokenizer files; pass token ids"):
        llm.generate("hello")


def test_unknown_dtype(checkpoint_dir):
    with pytest.raises(ValueError, match="dtype 'int3' is not supported"):
        LLM(checkpoint_dir("llama2"), dtype="int3")
