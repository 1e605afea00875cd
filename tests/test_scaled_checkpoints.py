"""Checkpoints of 8-bit weights times scales, dequantized as read: block-wise FP8 (DeepSeek-V3's and Qwen3-FP8's
format) as transformers dequantizes it, and llm-compressor's 8-bit compressed-tensors formats."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from hf_models import make_hf_model, save_hf_model
from safetensors.torch import load_file, save_file

from jaxinfer import LLM
from jaxinfer.checkpoint.scaled_weights import Fp8Values, ScaledSlice, raw_bytes
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import from_hf_config

PROMPT = np.random.RandomState(0).randint(3, 256, size=48).tolist()
FP8_MAX = 448.0


def quantize(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> e4m3 values and one float32 scale per block (the last blocks may be partial)."""
    rows, cols = block
    out, inp = w.shape
    br, bc = -(-out // rows), -(-inp // cols)
    padded = torch.zeros(br * rows, bc * cols)
    padded[:out, :inp] = w
    blocks = padded.reshape(br, rows, bc, cols)
    scales = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12)
    values = (blocks / scales[:, None, :, None]).reshape(br * rows, bc * cols)[:out, :inp]
    return values.to(torch.float8_e4m3fn), scales.to(torch.float32)


def hf_dequantize(values: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """transformers' own dequantization of FP8 blocks [out, in] (partial last blocks too); the test skips where this
    transformers has none (5.17: not at this name, and its loader's refuses partial blocks)."""
    try:
        from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no finegrained_fp8._dequantize_fp8_weight")
    return _dequantize_fp8_weight(values, scales, list(block), torch.float32)


def save_fp8(path: Path, block: tuple[int, int], scale_fmt: str = "float") -> dict[str, torch.Tensor]:
    """The tiny Qwen3 checkpoint at path with its layers' linear weights stored as FP8 blocks; returns the state
    dict transformers' own dequantization of that file gives."""
    tensors = load_file(path / "model.safetensors")
    dequantized = dict(tensors)
    for name in [n for n in tensors if n.startswith("model.layers.") and n.endswith("proj.weight")]:
        values, scales = quantize(tensors[name], block)
        if scale_fmt == "ue8m0":  # powers of two, as uint8 exponents biased by 127
            exponent = torch.ceil(torch.log2(scales))
            values, scales = quantize_with(tensors[name], block, torch.exp2(exponent))
            tensors[name + "_scale_inv"] = (exponent + 127).to(torch.uint8)
        else:
            tensors[name + "_scale_inv"] = scales
        tensors[name] = values
        dequantized[name] = hf_dequantize(values, scales, block)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": list(block), "scale_fmt": scale_fmt}
    (path / "config.json").write_text(json.dumps(config))
    return dequantized


def quantize_with(w: torch.Tensor, block: tuple[int, int], scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w's e4m3 values against given per-block scales."""
    rows, cols = block
    full = scales.repeat_interleave(rows, 0).repeat_interleave(cols, 1)[: w.shape[0], : w.shape[1]]
    return (w / full).to(torch.float8_e4m3fn), scales


@pytest.mark.parametrize("block,scale_fmt", [((32, 32), "float"), ((48, 40), "ue8m0")])  # partial edge blocks
def test_fp8_checkpoint_loads_as_transformers_dequantizes_it(tmp_path, block, scale_fmt):
    path = save_hf_model("qwen3", tmp_path / "model")
    dequantized = save_fp8(path, block, scale_fmt)
    hf = make_hf_model("qwen3")
    hf.load_state_dict(dequantized, strict=False)
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0].numpy()
    logits = LLM(path, dtype="float32", max_seq_len=64, cpu_kernels=False).logits(PROMPT)
    assert np.max(np.abs(logits - expected)) <= 1e-5 * np.max(np.abs(expected))


COMPRESSED = {  # name: (weights settings, the scales' shape for a weight [out, in], stored values)
    "fp8 channel": (dict(type="float", strategy="channel"), lambda o, i: (o, 1), torch.float8_e4m3fn),
    "fp8 tensor": (dict(type="float", strategy="tensor"), lambda o, i: (1,), torch.float8_e4m3fn),
    "int8 group 16": (dict(type="int", strategy="group", group_size=16), lambda o, i: (o, i // 16), torch.int8),
    "fp8 block 32x16": (dict(type="float", strategy="block", block_structure=[32, 16]),
                        lambda o, i: (-(-o // 32), -(-i // 16)), torch.float8_e4m3fn),
}


def compress(w: torch.Tensor, scale_shape: tuple[int, ...], stored: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """w's values and scales as llm-compressor stores them (value x scale is the weight, scales broadcast)."""
    out, inp = w.shape
    full = scale_shape if len(scale_shape) == 2 else (1, 1)
    rows, cols = -(-out // full[0]), -(-inp // full[1])
    padded = torch.zeros(full[0] * rows, full[1] * cols)
    padded[:out, :inp] = w
    top = FP8_MAX if stored == torch.float8_e4m3fn else 127.0
    scales = padded.reshape(full[0], rows, full[1], cols).abs().amax(dim=(1, 3)).clamp(min=1e-12) / top
    expanded = scales.repeat_interleave(rows, 0).repeat_interleave(cols, 1)[:out, :inp]
    values = w / expanded
    values = values.round().clamp(-127, 127).to(torch.int8) if stored == torch.int8 else values.to(stored)
    return values, scales.reshape(scale_shape).to(torch.bfloat16)


@pytest.mark.parametrize("name", sorted(COMPRESSED))
def test_compressed_tensors_checkpoints_load_as_values_times_scales(tmp_path, name):
    settings, scale_shape, stored = COMPRESSED[name]
    path = save_hf_model("qwen3", tmp_path / "model")
    tensors = load_file(path / "model.safetensors")
    dequantized = dict(tensors)
    for key in [n for n in tensors if n.startswith("model.layers.") and n.endswith("proj.weight")]:
        values, scales = compress(tensors[key], scale_shape(*tensors[key].shape), stored)
        tensors[key], tensors[key + "_scale"] = values, scales
        full = scales.float().reshape(scale_shape(*values.shape) if scales.dim() == 2 else (1, 1))
        rows, cols = -(-values.shape[0] // full.shape[0]), -(-values.shape[1] // full.shape[1])
        expanded = full.repeat_interleave(rows, 0).repeat_interleave(cols, 1)[: values.shape[0], : values.shape[1]]
        dequantized[key] = values.float() * expanded
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    weights = dict(num_bits=8, symmetric=True, dynamic=False, **settings)
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "int-quantized" if stored == torch.int8 else "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}, "ignore": ["lm_head"],
        "quantization_status": "compressed"}
    (path / "config.json").write_text(json.dumps(config))
    hf = make_hf_model("qwen3")
    hf.load_state_dict(dequantized, strict=False)
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0].numpy()
    logits = LLM(path, dtype="float32", max_seq_len=64, cpu_kernels=False).logits(PROMPT)
    assert np.max(np.abs(logits - expected)) <= 1e-5 * np.max(np.abs(expected)), name


@pytest.mark.parametrize("index", [(slice(0, 70), slice(0, 90)), (slice(13, 61), slice(41, 83)),
                                   (slice(47, 49), slice(79, 81)), (slice(0, 1), slice(89, 90))])
def test_a_slice_reads_its_part_of_the_dequantized_weight(tmp_path, index):
    """Sharded loads read slices: each, crossing partial blocks, equals its part of the whole weight."""
    w = torch.randn(70, 90)
    values, scales = quantize(w, (16, 32))
    save_file({"w": values, "w_scale_inv": scales}, tmp_path / "t.safetensors")
    whole = hf_dequantize(values, scales, (16, 32)).numpy()
    reader = ScaledSlice(Fp8Values(raw_bytes(tmp_path / "t.safetensors", "w")), scales.numpy(), (16, 32))
    assert reader.get_shape() == (70, 90)
    np.testing.assert_array_equal(reader[index], whole[index])


FP8 = {"quant_method": "fp8", "weight_block_size": [128, 128]}
CT_WEIGHTS = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}


def compressed(weights: dict | None = None, **fields) -> dict:
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": {"weights": {**CT_WEIGHTS, **(weights or {})}}}, **fields}


@pytest.mark.parametrize("quant,message", [
    ({**FP8, "fmt": "e5m2"}, "quantization_config.fmt 'e5m2' is not supported"),
    ({**FP8, "weight_block_size": [128]}, r"weight_block_size \[128\] must be two positive integers"),
    ({**FP8, "scale_fmt": "e4m3"}, "quantization_config.scale_fmt 'e4m3' is not supported"),
    (compressed(format="marlin-24"), "quantization_config.format 'marlin-24' is not supported"),
    (compressed({"num_bits": 4, "type": "int"}), r"group_0.weights: 4-bit int weights are not supported"),
    (compressed({"symmetric": False}), "symmetric false \\(zero points\\) is not supported"),
    (compressed({"strategy": "tensor_group"}), "strategy 'tensor_group' is not supported"),
    (compressed({"strategy": "group", "group_size": None}), "group_size None must be a positive integer"),
])
def test_settings_the_reader_does_not_take_are_refused_by_name(quant, message):
    config = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 4, "intermediate_size": 128, "quantization_config": quant}
    with pytest.raises(ConfigError, match=message):
        from_hf_config(config)
