"""A Whisper checkpoint (`WhisperForConditionalGeneration`, transformers' safetensors) read into the decoder's
`Weights` (models/whisper: the engine runs it) and the `AudioEncoder` (models/whisper_encoder: run once per
request). Quantization, meshes and the CPU kernels' packing are not applied to it (entrypoints refuse them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from jaxinfer.config.errors import CheckpointError
from jaxinfer.config.model import ModelConfig
from jaxinfer.models.decoder import Weights
from jaxinfer.models.whisper import PREFIX, WhisperLayer
from jaxinfer.models.whisper_encoder import AudioEncoder, CrossProjection, EncoderLayer

Read = Callable[[str], np.ndarray]


def tensor_reader(model_dir: Path) -> Read:
    """name -> float32 array over every safetensors file of the directory."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    where: dict[str, Path] = {}
    for path in files:
        with safe_open(path, framework="flax") as f:
            where.update((name, path) for name in f.keys())

    def read(name: str) -> np.ndarray:
        if name not in where:
            raise CheckpointError(f"{model_dir}: tensor {name!r} is missing (looked in "
                                  f"{', '.join(p.name for p in files) or 'no *.safetensors file'})")
        with safe_open(where[name], framework="flax") as f:
            return np.asarray(f.get_tensor(name), np.float32)

    return read


def _heads_in(w: np.ndarray, heads: int) -> np.ndarray:
    """torch Linear [H*K, D] -> [D, H, K]."""
    return w.T.reshape(w.shape[1], heads, -1)


def _heads_out(w: np.ndarray, heads: int) -> np.ndarray:
    """torch Linear [D, H*K] -> [H, K, D]."""
    return w.T.reshape(heads, -1, w.shape[0])


def _attention(read: Read, p: str, heads: int) -> dict[str, np.ndarray]:
    """An attention block's q/k/v/out weights and biases (k has none), in heads layout."""
    return dict(wq=_heads_in(read(p + "q_proj.weight"), heads), bq=read(p + "q_proj.bias").reshape(heads, -1),
                wk=_heads_in(read(p + "k_proj.weight"), heads), wv=_heads_in(read(p + "v_proj.weight"), heads),
                bv=read(p + "v_proj.bias").reshape(heads, -1), wo=_heads_out(read(p + "out_proj.weight"), heads),
                bo=read(p + "out_proj.bias"))


def _norm(read: Read, name: str, key: str) -> dict[str, np.ndarray]:
    return {key: read(name + ".weight"), key + "_bias": read(name + ".bias")}


def _mlp(read: Read, p: str) -> dict[str, np.ndarray]:
    return dict(w_up=read(p + "fc1.weight").T, b_up=read(p + "fc1.bias"), w_down=read(p + "fc2.weight").T,
                b_down=read(p + "fc2.bias"))


def decoder_weights(read: Read, cfg: ModelConfig) -> Weights:
    """The decoder as the shared `Weights` (tied head; layer 0 holds the learned positions)."""
    layers = []
    for i in range(cfg.num_layers):
        p = f"{PREFIX}layers.{i}."
        own, cross = _attention(read, p + "self_attn.", cfg.num_heads), _attention(read, p + "encoder_attn.",
                                                                                   cfg.num_heads)
        layers.append(WhisperLayer(
            **_norm(read, p + "self_attn_layer_norm", "attn_norm"), **own,
            **_norm(read, p + "encoder_attn_layer_norm", "cross_norm"),
            cq=cross["wq"], cbq=cross["bq"], co=cross["wo"], cbo=cross["bo"],
            **_norm(read, p + "final_layer_norm", "mlp_norm"), **_mlp(read, p),
            positions=read(PREFIX + "embed_positions.weight") if i == 0 else None,
        ))
    return Weights(embed=read(PREFIX + "embed_tokens.weight"), layers=layers,
                   final_norm=read(PREFIX + "layer_norm.weight"), final_norm_bias=read(PREFIX + "layer_norm.bias"))


def audio_encoder(read: Read, cfg: ModelConfig, encoder_layers: int, encoder_heads: int) -> AudioEncoder:
    """The encoder and each decoder layer's cross-attention key/value projections."""
    e = "model.encoder."
    layers = []
    for i in range(encoder_layers):
        p = f"{e}layers.{i}."
        layers.append(EncoderLayer(**_norm(read, p + "self_attn_layer_norm", "attn_norm"),
                                   **_attention(read, p + "self_attn.", encoder_heads),
                                   **_norm(read, p + "final_layer_norm", "mlp_norm"), **_mlp(read, p)))
    cross = []
    for i in range(cfg.num_layers):
        p = f"{PREFIX}layers.{i}.encoder_attn."
        cross.append(CrossProjection(wk=_heads_in(read(p + "k_proj.weight"), cfg.num_heads),
                                     wv=_heads_in(read(p + "v_proj.weight"), cfg.num_heads),
                                     bv=read(p + "v_proj.bias").reshape(cfg.num_heads, -1)))
    return AudioEncoder(
        conv1=read(e + "conv1.weight"), conv1_bias=read(e + "conv1.bias"), conv2=read(e + "conv2.weight"),
        conv2_bias=read(e + "conv2.bias"), positions=read(e + "embed_positions.weight"), layers=layers,
        **_norm(read, e + "layer_norm", "final_norm"), cross=cross,
    )


def as_dtype(tree: Any, dtype: jnp.dtype) -> Any:
    """Every leaf of a read tree as a jax array of `dtype`."""
    return jax.tree.map(lambda leaf: jnp.asarray(leaf, dtype), tree)
