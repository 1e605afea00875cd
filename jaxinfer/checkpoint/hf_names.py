"""Where each jaxinfer weight leaf lives in an HF Llama-family checkpoint, and how to reshape it."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from jaxinfer.config.model import ModelConfig

Index = tuple[slice, ...]


@dataclasses.dataclass(frozen=True)
class HFTensor:
    """An HF tensor name (with `{i}` for the layer), the transforms to and from jaxinfer's layout,
    and `hf_index`: the HF slice holding a slice of the jaxinfer array (so shards read only theirs)."""

    name: str
    to_jax: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    hf_index: Callable[[Index], Index]
    hf_shape: tuple[int, ...]
    per_layer: bool = True


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _heads_rows(heads: slice, dims: slice, head_dim: int) -> slice:
    """HF rows (heads * head_dim flattened) of a slice of heads; head_dim is never split."""
    if (dims.start, dims.stop) != (0, head_dim):
        raise ValueError(f"head_dim slices are not read from HF checkpoints, got {dims}")
    return slice(heads.start * head_dim, heads.stop * head_dim)


def _linear_in_heads(heads: int, head_dim: int) -> tuple[Callable, Callable, Callable]:
    """torch Linear [heads*K, D] <-> jaxinfer [D, heads, K] (to_jax also takes a slice of heads)."""

    def to_jax(w: np.ndarray) -> np.ndarray:
        return w.T.reshape(w.shape[1], -1, head_dim)

    def to_hf(w: np.ndarray) -> np.ndarray:
        return w.reshape(w.shape[0], heads * head_dim).T

    def hf_index(index: Index) -> Index:
        return _heads_rows(index[1], index[2], head_dim), index[0]

    return to_jax, to_hf, hf_index


def _linear_out_heads(heads: int, head_dim: int) -> tuple[Callable, Callable, Callable]:
    """torch Linear [D, heads*K] <-> jaxinfer [heads, K, D]."""

    def to_jax(w: np.ndarray) -> np.ndarray:
        return w.T.reshape(-1, head_dim, w.shape[0])

    def to_hf(w: np.ndarray) -> np.ndarray:
        return w.reshape(heads * head_dim, w.shape[-1]).T

    def hf_index(index: Index) -> Index:
        return index[2], _heads_rows(index[0], index[1], head_dim)

    return to_jax, to_hf, hf_index


def _bias_heads(heads: int, head_dim: int) -> tuple[Callable, Callable, Callable]:
    return (
        lambda b: b.reshape(-1, head_dim),
        lambda b: b.reshape(heads * head_dim),
        lambda index: (_heads_rows(index[0], index[1], head_dim),),
    )


def _transpose() -> tuple[Callable, Callable, Callable]:
    return (lambda w: w.T), (lambda w: w.T), (lambda index: index[::-1])


def hf_tensor_map(cfg: ModelConfig) -> dict[str, HFTensor]:
    """jaxinfer leaf path ('layers.wq', 'embed', ...) -> HF tensor; only leaves the config has."""
    H, KV, K = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    D, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    attn = "model.layers.{i}.self_attn."
    mlp = "model.layers.{i}.mlp."
    same = (_identity, _identity, _identity)
    table: dict[str, tuple[str, tuple[Callable, Callable, Callable], tuple[int, ...]]] = {
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
