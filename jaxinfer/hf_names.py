"""Where each jaxinfer weight leaf lives in an HF Llama-family checkpoint, and how to reshape it."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from jaxinfer.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class HFTensor:
    """An HF tensor name (with `{i}` for the layer) and the transform to jaxinfer's layout."""

    name: str
    to_jax: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    hf_shape: tuple[int, ...]
    per_layer: bool = True


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _linear_in_heads(heads: int, head_dim: int) -> tuple[Callable, Callable]:
    """torch Linear [heads*K, D] <-> jaxinfer [D, heads, K]."""

    def to_jax(w: np.ndarray) -> np.ndarray:
        return w.T.reshape(w.shape[1], heads, head_dim)

    def to_hf(w: np.ndarray) -> np.ndarray:
        return w.reshape(w.shape[0], heads * head_dim).T

    return to_jax, to_hf


def _linear_out_heads(heads: int, head_dim: int) -> tuple[Callable, Callable]:
    """torch Linear [D, heads*K] <-> jaxinfer [heads, K, D]."""

    def to_jax(w: np.ndarray) -> np.ndarray:
        return w.T.reshape(heads, head_dim, w.shape[0])

    def to_hf(w: np.ndarray) -> np.ndarray:
        return w.reshape(heads * head_dim, w.shape[-1]).T

    return to_jax, to_hf


def _bias_heads(heads: int, head_dim: int) -> tuple[Callable, Callable]:
    return (lambda b: b.reshape(heads, head_dim)), (lambda b: b.reshape(heads * head_dim))


def _transpose() -> tuple[Callable, Callable]:
    return (lambda w: w.T), (lambda w: w.T)


def hf_tensor_map(cfg: ModelConfig) -> dict[str, HFTensor]:
    """jaxinfer leaf path ('layers.wq', 'embed', ...) -> HF tensor; only leaves the config has."""
    H, KV, K = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    D, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    attn = "model.layers.{i}.self_attn."
    mlp = "model.layers.{i}.mlp."
    same = (_identity, _identity)
    table: dict[str, tuple[str, tuple[Callable, Callable], tuple[int, ...]]] = {
        "layers.attn_norm": ("model.layers.{i}.input_layernorm.weight", same, (D,)),
        "layers.wq": (attn + "q_proj.weight", _linear_in_heads(H, K), (H * K, D)),
        "layers.wk": (attn + "k_proj.weight", _linear_in_heads(KV, K), (KV * K, D)),
        "layers.wv": (attn + "v_proj.weight", _linear_in_heads(KV, K), (KV * K, D)),
        "layers.wo": (attn + "o_proj.weight", _linear_out_heads(H, K), (D, H * K)),
        "layers.mlp_norm": ("model.layers.{i}.post_attention_layernorm.weight", same, (D,)),
        "layers.w_gate": (mlp + "gate_proj.weight", _transpose(), (F, D)),
        "layers.w_up": (mlp + "up_proj.weight", _transpose(), (F, D)),
        "layers.w_down": (mlp + "down_proj.weight", _transpose(), (D, F)),
    }
    if cfg.qkv_bias:
        table["layers.bq"] = (attn + "q_proj.bias", _bias_heads(H, K), (H * K,))
        table["layers.bk"] = (attn + "k_proj.bias", _bias_heads(KV, K), (KV * K,))
        table["layers.bv"] = (attn + "v_proj.bias", _bias_heads(KV, K), (KV * K,))
    if cfg.o_bias:
        table["layers.bo"] = (attn + "o_proj.bias", same, (D,))
    if cfg.qk_norm:
        table["layers.q_norm"] = (attn + "q_norm.weight", same, (K,))
        table["layers.k_norm"] = (attn + "k_norm.weight", same, (K,))
    out = {path: HFTensor(name, *fns, shape) for path, (name, fns, shape) in table.items()}
    out["embed"] = HFTensor("model.embed_tokens.weight", *same, (V, D), per_layer=False)
    out["final_norm"] = HFTensor("model.norm.weight", *same, (D,), per_layer=False)
    if not cfg.tie_word_embeddings:
        out["lm_head"] = HFTensor("lm_head.weight", *_transpose(), (V, D), per_layer=False)
    return out


def expected_hf_names(cfg: ModelConfig) -> set[str]:
    """Every tensor name a complete checkpoint for this config holds."""
    names: set[str] = set()
    for t in hf_tensor_map(cfg).values():
        if t.per_layer:
            names.update(t.name.format(i=i) for i in range(cfg.num_layers))
        else:
            names.add(t.name)
    return names
