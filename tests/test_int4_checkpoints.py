"""AWQ, GPTQ and compressed-tensors pack-quantized checkpoints: the tiny Qwen3's projections quantized and packed
here, by packers written from each format's description (not the loader's unpacking run backwards), then loaded."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from hf_models import make_hf_model
from jax import export
from safetensors.torch import load_file, save_file

from jaxinfer import LLM, SamplingParams
from jaxinfer.checkpoint.converted import save_converted
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.config.model import ConfigError
from jaxinfer.models.registry import from_hf_config
from jaxinfer.quantization.quantized_experts import QuantizedExperts, dequantize_experts
from jaxinfer.quantization.quantized_weight import QuantizedWeight, dequantize, quantized_matmul, tile

DEQUANTIZE = jax.jit(dequantize)  # one program per shape, not one per operation
PROMPT = np.random.RandomState(0).randint(3, 256, size=24).tolist()
GROUP = 32
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ GEMM: word slot i holds output column 8c + AWQ_ORDER[i]


def quantize_levels(w: np.ndarray, groups: np.ndarray, symmetric: bool, lowest_zero: int = 0,
                    scale_dtype: type = np.float16, bits: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w [out, in] -> levels [out, in] (0..2^bits - 1), zero levels [out, G] and scales [out, G] (one per group of
    inputs, `groups[i]` the group of input i): symmetric around 2^(bits - 1), or min-max with zero levels from
    lowest_zero up."""
    top, middle = (1 << bits) - 1, 1 << (bits - 1)
    members = [groups == g for g in range(int(groups.max()) + 1)]
    lo = np.stack([w[:, m].min(1) for m in members], 1).clip(max=0)
    hi = np.stack([w[:, m].max(1) for m in members], 1).clip(min=0)
    if symmetric:
        scales = (np.maximum(hi, -lo) / (middle - 1)).clip(min=1e-4).astype(scale_dtype)
        zeros = np.full(scales.shape, middle)
    else:
        scales = ((hi - lo) / top).clip(min=1e-4).astype(scale_dtype)
        zeros = np.round(-lo / scales.astype(np.float32)).clip(lowest_zero, top).astype(np.int64)
    full_scales = scales.astype(np.float32)[:, groups]
    levels = np.round(w / full_scales + zeros[:, groups]).clip(0, top).astype(np.int64)
    return levels, zeros, scales


def as_torch(a: np.ndarray) -> torch.Tensor:
    """A NumPy array as a torch tensor (bfloat16 through float32: every value is one already)."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def pack_words(values: np.ndarray, axis: int, slots: list[int] | None = None, bits: int = 4) -> np.ndarray:
    """bits-bit values [.., n, ..] -> int32 words [.., n * bits / 32, ..] along `axis`: word slot i (bits
    bits * i and up) holds the value at position slots[i] of its run (position i when slots is None)."""
    per = 32 // bits
    moved = np.moveaxis(values.astype(np.uint64), axis, -1)
    runs = moved.reshape(*moved.shape[:-1], -1, per)
    words = np.zeros(runs.shape[:-1], np.uint64)
    for i in range(per):
        words |= (runs[..., (slots or list(range(per)))[i]] & ((1 << bits) - 1)) << np.uint64(bits * i)
    return np.ascontiguousarray(np.moveaxis(words.astype(np.uint32).view(np.int32), -1, axis))


def pack_awq(levels, zeros, scales, groups) -> dict[str, np.ndarray]:
    return {"qweight": pack_words(levels.T, 1, AWQ_ORDER), "qzeros": pack_words(zeros.T, 1, AWQ_ORDER),
            "scales": scales.T}


def pack_gptq(levels, zeros, scales, groups, v1: bool = True, bits: int = 4) -> dict[str, np.ndarray]:
    stored_zeros = (zeros - 1) % (1 << bits) if v1 else zeros  # v1 stores each zero point minus one
    return {"qweight": pack_words(levels.T, 0, bits=bits), "qzeros": pack_words(stored_zeros.T, 1, bits=bits),
            "scales": scales.T, "g_idx": groups.astype(np.int32)}


def pack_compressed(levels, zeros, scales, groups, symmetric: bool) -> dict[str, np.ndarray]:
    """llm-compressor stores signed values plus 8: exactly the 0..15 levels (and zero levels)."""
    out = {"weight_packed": pack_words(levels, 1), "weight_scale": scales,
           "weight_shape": np.array(levels.shape, np.int32)}
    if not symmetric:
        out["weight_zero_point"] = pack_words(zeros, 0)
    return out


CASES = {  # name: (quantization_config, packer, (symmetric, scales' dtype, act order, lowest zero), stored suffixes)
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"},
            pack_awq, (False, np.float16, False, 0)),
    "gptq v1 sym": ({"quant_method": "gptq", "bits": 4, "group_size": GROUP, "sym": True, "desc_act": False},
                    pack_gptq, (True, np.float16, False, 0)),
    "gptq v1 asym act-order": ({"quant_method": "gptq", "bits": 4, "group_size": GROUP, "sym": False, "desc_act": True},
                               pack_gptq, (False, np.float16, True, 1)),
    "gptq v2 asym": ({"quant_method": "gptq", "bits": 4, "group_size": GROUP, "sym": False,
                      "checkpoint_format": "gptq_v2"},
                     lambda *a: pack_gptq(*a, v1=False), (False, np.float16, False, 0)),
    "gptq 8-bit": ({"quant_method": "gptq", "bits": 8, "group_size": GROUP, "sym": False, "desc_act": False},
                   lambda *a: pack_gptq(*a, bits=8), (False, np.float16, False, 1)),
    "compressed sym bf16": (
        {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"], "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                          "strategy": "group", "group_size": GROUP}}}},
        lambda *a: pack_compressed(*a, symmetric=True), (True, ml_dtypes.bfloat16, False, 0)),
    "compressed channel": (  # one scale per output over all inputs (group 0)
        {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                          "strategy": "channel"}}}},
        lambda *a: pack_compressed(*a, symmetric=True), (True, np.float16, False, 0)),
    "compressed asym": (
        {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"], "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": False,
                                                          "strategy": "group", "group_size": GROUP}}}},
        lambda *a: pack_compressed(*a, symmetric=False), (False, np.float16, False, 0)),
}


def save_packed(path: Path, name: str) -> dict[str, torch.Tensor]:
    """The tiny Qwen3 at path with its layers' projections packed as CASES[name] says; returns the state dict of
    the test's own dequantization ((level - zero) * scale)."""
    quant, packer, (symmetric, scale_dtype, act_order, lowest_zero) = CASES[name]
    tensors = load_file(path / "model.safetensors")
    dequantized = dict(tensors)
    rng = np.random.default_rng(0)
    for key in sorted(n for n in tensors if n.startswith("model.layers.") and n.endswith("proj.weight")):
        w = tensors.pop(key).numpy()
        inputs = w.shape[1]
        groups = np.arange(inputs) // (inputs if "channel" in name else GROUP)
        if act_order:  # GPTQ's desc_act: groups follow a permutation of the inputs
            groups = groups[np.argsort(rng.permutation(inputs))]
        levels, zeros, scales = quantize_levels(w, groups, symmetric, lowest_zero, scale_dtype, quant.get("bits", 4))
        dequantized[key] = torch.from_numpy((levels - zeros[:, groups]) * scales.astype(np.float32)[:, groups]).float()
        prefix = key[: -len("weight")]
        tensors.update({prefix + suffix: as_torch(a) for suffix, a in packer(levels, zeros, scales, groups).items()})
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = quant
    (path / "config.json").write_text(json.dumps(config))
    return dequantized


def packed_copy(base: Path, out: Path, name: str) -> dict[str, torch.Tensor]:
    """A copy of the float checkpoint at base packed as CASES[name] says (see `save_packed`)."""
    shutil.copytree(base, out)
    return save_packed(out, name)


@pytest.fixture(scope="module", params=sorted(CASES))
def packed_checkpoint(request, checkpoint_dir, tmp_path_factory) -> tuple[str, Path, dict[str, torch.Tensor]]:
    path = tmp_path_factory.mktemp("packed") / "model"
    return request.param, path, packed_copy(checkpoint_dir("qwen3"), path, request.param)


def test_packed_weights_read_as_the_tests_own_dequantization(packed_checkpoint, tmp_path):
    """Read as floats, every projection equals (level - zero) * scale exactly; kept in 4 bits, its int4 leaf
    dequantizes to the same values (act order's inputs stored sorted by group; 8-bit loads as floats);
    a converted checkpoint does not store zero levels or fp16 scales, and says so."""
    name, path, dequantized = packed_checkpoint
    _, floats = load_weights(path, jnp.float32, progress=False)
    np.testing.assert_array_equal(np.asarray(floats.layers[1].w_down),
                                  dequantized["model.layers.1.mlp.down_proj.weight"].T)
    np.testing.assert_array_equal(np.asarray(floats.layers[0].wq).reshape(64, -1),
                                  dequantized["model.layers.0.self_attn.q_proj.weight"].T)
    _, kept = load_weights(path, jnp.float32, progress=False, keep_int4=True)
    for field in ("wq", "wo", "w_down"):
        leaf, expected = getattr(kept.layers[0], field), getattr(floats.layers[0], field)
        if "8-bit" in name:  # loaded dequantized
            assert not isinstance(leaf, QuantizedWeight)
            continue
        assert isinstance(leaf, QuantizedWeight) and leaf.mode == "int4"
        assert leaf.group == (leaf.in_size if "channel" in name else GROUP)
        assert (leaf.perm is not None) == ("act-order" in name)  # inputs stored sorted by group
        assert (leaf.zeros is None) == CASES[name][2][0]  # zero levels kept unless symmetric
        assert leaf.scales.dtype == (jnp.bfloat16 if "bf16" in name else jnp.float16)  # fp16 kept: bf16 would round
        assert tile(leaf).tiled == ("bf16" in name)  # symmetric bf16 groups of 32: the CPU kernel's own layout
        np.testing.assert_array_equal(np.asarray(DEQUANTIZE(leaf)), np.asarray(expected))
    if isinstance(kept.layers[0].wq, QuantizedWeight) and "bf16" not in name:
        with pytest.raises(ValueError, match="layers.0.wq holds a 4-bit checkpoint's own levels"):
            save_converted(kept, path, tmp_path / "converted")


@pytest.mark.parametrize("name", ["awq"])
def test_packed_checkpoints_run_as_transformers_runs_their_dequantized_weights(checkpoint_dir, tmp_path, name):
    """Logits against HF's float model holding the dequantized weights; greedy tokens through the engine equal HF's."""
    path = tmp_path / "model"
    hf = make_hf_model("qwen3")
    assert not hf.load_state_dict(packed_copy(checkpoint_dir("qwen3"), path, name), strict=False).unexpected_keys
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0].numpy()
        hf_tokens = hf.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False)[0, len(PROMPT):].tolist()
    llm = LLM(path, dtype="float32", max_seq_len=64)
    assert isinstance(llm.weights.layers[0].w_down, QuantizedWeight)  # the checkpoint's 4 bits, in memory
    logits = llm.logits(PROMPT)
    assert np.max(np.abs(logits - expected)) <= 1e-5 * np.max(np.abs(expected)), name
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    assert llm.generate([PROMPT], greedy)[0].outputs[0].token_ids == hf_tokens


def test_moe_experts_stay_in_the_checkpoints_4_bits(checkpoint_dir, tmp_path):
    """GPTQ's per-expert tensors (Qwen3-MoE: experts.{e}.*_proj) load as int4 experts with zero levels equal to
    the test's dequantization; the router stays float; logits match HF's float model holding those weights."""
    path = tmp_path / "model"
    dequantized = packed_copy(checkpoint_dir("qwen3_moe"), path, "gptq v2 asym")
    _, floats = load_weights(path, jnp.float32, progress=False)
    expert = dequantized["model.layers.1.mlp.experts.3.down_proj.weight"].numpy()
    np.testing.assert_array_equal(np.asarray(floats.layers[1].moe_down[3]), expert.T)
    llm = LLM(path, dtype="float32", max_seq_len=64, cpu_kernels=False)
    down, gate = llm.weights.layers[1].moe_down, llm.weights.layers[1].moe_gate
    assert isinstance(down, QuantizedExperts) and down.zeros is not None and down.scales.dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(jax.jit(dequantize_experts)(gate)), np.asarray(floats.layers[1].moe_gate))
    # transformers 5 fuses the experts as it loads, so HF reads the dequantized weights from a checkpoint
    shutil.copytree(checkpoint_dir("qwen3_moe"), tmp_path / "float")
    save_file({k: v.contiguous() for k, v in dequantized.items()}, tmp_path / "float" / "model.safetensors",
              metadata={"format": "pt"})
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "float", dtype=torch.float32)
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0].numpy()
    assert np.max(np.abs(llm.logits(PROMPT) - expected)) <= 1e-5 * np.max(np.abs(expected))


def test_zero_levels_enter_the_product_exactly():
    """The XLA product of an int4 weight with zero levels, fp16 scales and an input order equals x @ its
    dequantized matrix."""
    rng = np.random.default_rng(1)
    q = QuantizedWeight(jnp.asarray(rng.integers(0, 256, (32, 48)), jnp.uint8),
                        jnp.asarray(rng.uniform(0.01, 0.1, (2, 48)), jnp.float16), (64, 48), 1, "int4", 32,
                        zeros=jnp.asarray(rng.integers(0, 17, (2, 48)), jnp.uint8),
                        perm=jnp.asarray(rng.permutation(64), jnp.int32))  # act order's input order
    x = jnp.asarray(rng.normal(size=(5, 64)), jnp.float32)
    expected = np.asarray(x, np.float64) @ np.asarray(DEQUANTIZE(q), np.float64)
    np.testing.assert_allclose(np.asarray(jax.jit(quantized_matmul)(x, q)), expected, rtol=1e-5, atol=1e-5)
    unordered = np.asarray(DEQUANTIZE(dataclasses.replace(q, perm=None)))
    np.testing.assert_array_equal(np.asarray(DEQUANTIZE(q))[np.asarray(q.perm)], unordered)  # row i is input perm[i]
    for platform in ("cuda", "tpu"):  # plain XLA ops, no kernel: it lowers for the accelerators
        export.export(jax.jit(quantized_matmul), platforms=[platform])(x.astype(jnp.bfloat16), q)


def _config(quant: dict) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 128, "quantization_config": quant}


AWQ, GPTQ = CASES["awq"][0], CASES["gptq v1 sym"][0]
PACKED = CASES["compressed asym"][0]


@pytest.mark.parametrize("quant,message", [
    ({**AWQ, "version": "gemv"}, "version 'gemv' is not supported; AWQ checkpoints are read in AutoAWQ's 'gemm'"),
    ({**AWQ, "version": "marlin"}, "version 'marlin' is not supported"),
    ({**AWQ, "zero_point": False}, "zero_point False is not supported"),
    ({**GPTQ, "bits": 3}, "quantization_config.bits 3 is not supported; use one of 4, 8"),
    ({**GPTQ, "checkpoint_format": "marlin"}, "checkpoint_format 'marlin' is not supported"),
    ({**GPTQ, "group_size": 0}, "group_size 0 must be a positive integer or -1"),
    ({**GPTQ, "pack_dtype": "int16"}, "pack_dtype 'int16' is not supported; GPTQ checkpoints are read packed"),
    ({**PACKED, "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float", "strategy": "group"}}}},
     "4-bit float weights are not supported in pack-quantized"),
    ({**PACKED, "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "tensor"}}}},
     "strategy 'tensor' is not supported in pack-quantized"),
])
def test_packed_settings_the_reader_does_not_take_are_refused_by_name(quant, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config(_config(quant))


@pytest.mark.parametrize("name", ["awq", "gptq v1 asym act-order"])
def test_a_float_update_is_quantized_in_the_checkpoints_layout(checkpoint_dir, tmp_path, name):
    """LLM.update_weights with float weights: jaxinfer's symmetric int4 in the served leaves' layout (zero
    levels of 8, float16 scales, the identity input order), decoding as the same weights loaded with
    quantization="int4" and compiling no program."""
    path = tmp_path / "model"
    packed_copy(checkpoint_dir("qwen3"), path, name)
    llm = LLM(path, dtype="float32", max_seq_len=64)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    llm.generate([PROMPT], greedy)
    float_weights = LLM(checkpoint_dir("qwen3"), dtype="float32", max_seq_len=64).weights
    llm.update_weights(float_weights)
    served = llm.weights.layers[0].w_down
    assert served.zeros is not None and served.scales.dtype == jnp.float16  # the checkpoint's layout kept
    compiled = llm.engine.runner.compiled_programs()
    tokens = llm.generate([PROMPT], greedy)[0].outputs[0].token_ids
    assert llm.engine.runner.compiled_programs() == compiled
    reference = LLM(checkpoint_dir("qwen3"), dtype="float32", max_seq_len=64, quantization="int4")
    assert tokens == reference.generate([PROMPT], greedy)[0].outputs[0].token_ids
