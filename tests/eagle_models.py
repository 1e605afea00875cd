"""Tiny random EAGLE-1 and EAGLE-3 heads written with the published HF tensor names and shapes.

Written with NumPy from the names alone (not with jaxinfer's writer), so loading them checks
jaxinfer against the layout the reference code and vLLM read.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hf_models import save_hf_model
from safetensors.numpy import save_file


def _layer(prefix: str, d: int, inputs: int, heads: int, kv_heads: int, head_dim: int, ffn: int, rng) -> dict:
    w = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
    return {
        prefix + "self_attn.q_proj.weight": w(heads * head_dim, inputs),
        prefix + "self_attn.k_proj.weight": w(kv_heads * head_dim, inputs),
        prefix + "self_attn.v_proj.weight": w(kv_heads * head_dim, inputs),
        prefix + "self_attn.o_proj.weight": w(d, heads * head_dim),
        prefix + "mlp.gate_proj.weight": w(ffn, d),
        prefix + "mlp.up_proj.weight": w(ffn, d),
        prefix + "mlp.down_proj.weight": w(d, ffn),
        prefix + "post_attention_layernorm.weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
    }


def head_config(target_dir: Path, **extra) -> dict:
    """A head config.json: the target's shape, one layer, as the published heads write it."""
    target = json.loads((Path(target_dir) / "config.json").read_text())
    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size", "rms_norm_eps",
            "max_position_embeddings", "rope_theta", "rope_parameters", "head_dim")
    config = {k: target[k] for k in keys if k in target}
    config.update(architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=1,
                  intermediate_size=96, hidden_act="silu", torch_dtype="float32")
    config.update(extra)
    return config


def save_eagle1(path: Path, target_dir: Path, seed: int = 0, fc_bias: bool = True, embed_copy: bool = True) -> Path:
    """An EAGLE-1 head (cnets1.py names; with the frozen embedding copy the reference code saves)."""
    config = head_config(target_dir)
    d, v = config["hidden_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or d // heads
    rng = np.random.default_rng(seed)
    tensors = {"fc.weight": (0.1 * rng.standard_normal((d, 2 * d))).astype(np.float32)}
    if fc_bias:
        tensors["fc.bias"] = (0.1 * rng.standard_normal(d)).astype(np.float32)
    if embed_copy:
        tensors["embed_tokens.weight"] = np.zeros((v, d), np.float32)
    tensors.update(_layer("layers.0.", d, d, heads, kv, head_dim, config["intermediate_size"], rng))
    return _write(path, config, tensors)


def save_eagle3(path: Path, target_dir: Path, draft_vocab: int, layers: tuple[int, int, int], seed: int = 0) -> Path:
    """An EAGLE-3 head (cnets.py names): midlayer over [2D], fc over 3 target layers, reduced vocabulary."""
    config = head_config(
        target_dir, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=draft_vocab,
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(layers)},
    )
    d, v = config["hidden_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or d // heads
    rng = np.random.default_rng(seed)
    draft_ids = np.sort(rng.choice(v, draft_vocab, replace=False))
    tensors = {
        "fc.weight": (0.1 * rng.standard_normal((d, 3 * d))).astype(np.float32),
        "midlayer.input_layernorm.weight": np.ones(d, np.float32),
        "midlayer.hidden_norm.weight": np.ones(d, np.float32),
        "norm.weight": np.ones(d, np.float32),
        "lm_head.weight": (0.3 * rng.standard_normal((draft_vocab, d))).astype(np.float32),
        "d2t": (draft_ids - np.arange(draft_vocab)).astype(np.int64),
        "t2d": np.isin(np.arange(v), draft_ids),
    }
    tensors.update(_layer("midlayer.", d, 2 * d, heads, kv, head_dim, config["intermediate_size"], rng))
    return _write(path, config, tensors)


def _write(path: Path, config: dict, tensors: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, path / "model.safetensors")
    return path


def tiny_target_and_heads(root: Path) -> dict:
    """A 3-layer tiny target (EAGLE-3 reads three of its layers), an EAGLE-1 and an EAGLE-3 head."""
    target = save_hf_model("llama2", root / "target", num_hidden_layers=3)
    return {
        "target": target,
        1: save_eagle1(root / "eagle1", target),
        3: save_eagle3(root / "eagle3", target, draft_vocab=96, layers=(0, 1, 2)),
    }
