"""MXFP4 checkpoints (GPT-OSS's released format): dequantized as read, as transformers dequantizes them."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch
import transformers
from hf_models import save_hf_model
from jax.sharding import AbstractMesh
from safetensors.numpy import load_file, save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors, dequantize_convertops

from jaxinfer import LLM
from jaxinfer.checkpoint.converted import QUANT_KEY, save_converted
from jaxinfer.checkpoint.mxfp4 import E2M1, GROUP, Mxfp4Slice, dequantize
from jaxinfer.config.model import ConfigError
from jaxinfer.entrypoints.cli import main as cli_main
from jaxinfer.entrypoints.model_loading import stored_experts_mode
from jaxinfer.models import load_config
from jaxinfer.models.registry import from_hf_config
from jaxinfer.parallel.sharding import Layout
from jaxinfer.quantization.quantized_experts import QuantizedExperts

PROMPT = np.random.RandomState(0).randint(3, 256, size=64).tolist()
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [E, in, out] -> MXFP4 blocks [E, out, in / 32, 16] and scales [E, out, in / 32] (nearest E2M1 values)."""
    groups = np.swapaxes(w, -1, -2).reshape(w.shape[0], w.shape[2], -1, GROUP)
    exponent = np.ceil(np.log2(np.maximum(np.abs(groups).max(-1), 1e-30) / 6.0)).astype(np.int32)
    scaled = groups / np.ldexp(1.0, exponent)[..., None]
    codes = np.abs(scaled[..., None] - E2M1).argmin(-1).astype(np.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), (exponent + 127).astype(np.uint8)


@pytest.fixture(scope="module")
def mxfp4_checkpoint(tmp_path_factory):
    """The tiny GPT-OSS checkpoint with its experts stored as MXFP4 (as the released ones are)."""
    path = save_hf_model("gpt_oss", tmp_path_factory.mktemp("gpt_oss_mxfp4"))
    tensors = load_file(path / "model.safetensors")
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = quantize(tensors.pop(name))
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}
    (path / "config.json").write_text(json.dumps(config))
    return path


def random_packed(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (*shape, 16), dtype=np.uint8),
            rng.integers(120, 134, shape, dtype=np.uint8))


def test_dequantize_matches_transformers():
    blocks, scales = random_packed((3, 6, 4))  # [E, out, groups]
    theirs = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    ours = np.swapaxes(dequantize(blocks, scales), -1, -2)  # [E, in, out], as transformers returns it
    np.testing.assert_array_equal(ours, theirs.numpy())


@pytest.mark.parametrize("index", [(slice(0, 3), slice(0, 128), slice(0, 6)),  # whole
                                   (slice(1, 2), slice(40, 70), slice(2, 5)),  # mid-group inputs
                                   (slice(0, 3), slice(96, 128), slice(0, 1))])
def test_a_slice_reads_only_its_groups_and_equals_the_whole_tensors_slice(index):
    blocks, scales = random_packed((3, 6, 4), seed=1)
    whole = np.swapaxes(dequantize(blocks, scales), -1, -2)
    np.testing.assert_array_equal(Mxfp4Slice(blocks, scales)[index], whole[index])


def test_mxfp4_checkpoint_gives_transformers_logits(mxfp4_checkpoint, tmp_path):
    if "dtype" not in inspect.signature(dequantize_convertops).parameters:
        pytest.skip(f"transformers {transformers.__version__} dequantizes MXFP4 experts to bfloat16 whatever the "
                    "model's dtype (not float32)")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        mxfp4_checkpoint, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.float32)
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0].numpy()
    llm = LLM(str(mxfp4_checkpoint), dtype="float32", max_seq_len=128)
    got = llm.logits(PROMPT)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    # The experts stay MXFP4 (as stored, a quarter of their bf16 bytes); a converted copy keeps them so.
    experts = llm.weights.layers[0].moe_down
    assert isinstance(experts, QuantizedExperts) and experts.mode == "mxfp4" and experts.values.dtype == np.uint8
    restored = LLM(save_converted(llm.weights, mxfp4_checkpoint, tmp_path / "converted"), max_seq_len=128)
    assert restored.weights.layers[0].moe_down.mode == "mxfp4"
    np.testing.assert_array_equal(restored.logits(PROMPT), got)


def test_mxfp4_experts_load_in_the_dtype_where_tp_would_cut_their_groups(mxfp4_checkpoint):
    """The tiny model's 32 hidden units are one group: at tp 2 they cannot split, so the experts load as floats."""
    cfg = load_config(mxfp4_checkpoint)
    assert stored_experts_mode(mxfp4_checkpoint, cfg, Layout(), None) == "mxfp4"
    assert stored_experts_mode(mxfp4_checkpoint, cfg, Layout(), "int8") is None  # the asked-for mode wins
    split = Layout(AbstractMesh((1, 1, 2), ("dp", "ep", "tp")))
    assert stored_experts_mode(mxfp4_checkpoint, cfg, split, None) is None


def test_other_quantization_methods_are_refused_by_name():
    hf = dict(architectures=["LlamaForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
              num_hidden_layers=2, num_attention_heads=4, quantization_config={"quant_method": "hqq"})
    with pytest.raises(ConfigError, match="quantization_config.quant_method 'hqq' is not supported.*mxfp4"):
        from_hf_config(hf)


def test_convert_keeps_mxfp4_experts(mxfp4_checkpoint, tmp_path):
    """`jaxinfer convert` quantizes each leaf as it reads it: MXFP4 experts stay MXFP4 without --quantize."""
    out = tmp_path / "converted"
    assert cli_main(["convert", str(mxfp4_checkpoint), str(out), "--dtype", "float32"]) == 0
    stored = json.loads((out / "config.json").read_text())[QUANT_KEY]
    assert stored == {"mode": None, "group_size": 0, "experts": {"mode": "mxfp4", "group_size": 32}}
    expected = LLM(str(mxfp4_checkpoint), dtype="float32", max_seq_len=128).logits(PROMPT)
    np.testing.assert_array_equal(LLM(out, max_seq_len=128).logits(PROMPT), expected)
