"""An encoder checkpoint's tensors (BERT, RoBERTa, XLM-RoBERTa, as transformers saves them) read into
`models/encoder`'s weight tree and a sequence classifier's head.

A base model's tensors are stored bare (`embeddings.word_embeddings.weight`) or under its model prefix
(`bert.`, `roberta.`: a `*ForSequenceClassification` checkpoint's, and some hub base models'); older
checkpoints name LayerNorm scales `gamma` / `beta`. Tensors no model part reads (BertModel's unused
pooler, `embeddings.position_ids`, a pretraining head) are skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.checkpoint.loader import open_safetensors
from jaxinfer.config.errors import CheckpointError
from jaxinfer.models.encoder import Dense, EncoderLayer, EncoderWeights, Norm
from jaxinfer.models.encoder_config import EncoderConfig
from jaxinfer.models.encoder_heads import EncoderHead

PREFIXES = ("", "bert.", "roberta.")
# EncoderLayer field -> its HF module under encoder.layer.{i}.
LAYER_MODULES = {
    "query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
    "attn_out": "attention.output.dense", "attn_norm": "attention.output.LayerNorm",
    "mlp_in": "intermediate.dense", "mlp_out": "output.dense", "mlp_norm": "output.LayerNorm",
}


class EncoderTensors:
    """Reads named tensors of one checkpoint (tensor name -> file `index`) as `dtype` arrays on the device."""

    def __init__(self, model_dir: Path, index: Mapping[str, Path], dtype: Any):
        self.model_dir, self.index, self.dtype = model_dir, index, jnp.dtype(dtype)
        self.prefix = next((p for p in PREFIXES if f"{p}embeddings.word_embeddings.weight" in index), None)
        if self.prefix is None:
            raise CheckpointError(f"checkpoint {model_dir} has no embeddings.word_embeddings.weight (bare or under "
                                  f"{', '.join(p for p in PREFIXES if p)}); expected a BERT or RoBERTa checkpoint")
        self._open: dict[Path, Any] = {}

    def array(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Tensor `name` (its legacy gamma/beta name too) as stored, checked against `shape`."""
        legacy = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        found = next((n for n in (name, legacy) if n in self.index), None)
        if found is None:
            raise CheckpointError(f"checkpoint {self.model_dir} has no tensor {name}; a "
                                  "BERT / RoBERTa checkpoint saved by transformers stores it")
        path = self.index[found]
        if path not in self._open:
            self._open[path] = open_safetensors(path)
        value = self._open[path].get_slice(found)[:]
        if tuple(value.shape) != shape:
            raise CheckpointError(f"tensor {found} in {path.name} has shape {tuple(value.shape)}, expected {shape}")
        return value

    def leaf(self, name: str, shape: tuple[int, ...], transpose: bool = False) -> jax.Array:
        """Tensor `name` on the device in the model's dtype; a torch Linear's [out, in] as [in, out]."""
        value = self.array(name, shape[::-1] if transpose else shape)
        return jax.device_put(np.ascontiguousarray(value.T if transpose else value)).astype(self.dtype)

    def dense(self, module: str, d_in: int, d_out: int) -> Dense:
        """A Linear module's weight (as [in, out]) and bias."""
        return Dense(self.leaf(f"{module}.weight", (d_in, d_out), True), self.leaf(f"{module}.bias", (d_out,)))

    def norm(self, module: str, size: int) -> Norm:
        """A LayerNorm module's scale and bias."""
        return Norm(self.leaf(f"{module}.weight", (size,)), self.leaf(f"{module}.bias", (size,)))


def load_encoder_weights(tensors: EncoderTensors, cfg: EncoderConfig) -> EncoderWeights:
    """The encoder's weight tree from its checkpoint."""
    d, f, p = cfg.hidden_size, cfg.intermediate_size, f"{tensors.prefix}embeddings."
    sizes = {"mlp_in": (d, f), "mlp_out": (f, d)}
    layers = []
    for i in range(cfg.num_layers):
        module = f"{tensors.prefix}encoder.layer.{i}."
        parts = {field: (tensors.norm(module + hf, d) if field.endswith("norm")
                         else tensors.dense(module + hf, *sizes.get(field, (d, d))))
                 for field, hf in LAYER_MODULES.items()}
        layers.append(EncoderLayer(**parts))
    return EncoderWeights(
        tensors.leaf(p + "word_embeddings.weight", (cfg.vocab_size, d)),
        tensors.leaf(p + "position_embeddings.weight", (cfg.max_len + cfg.position_offset, d)),
        tensors.leaf(p + "token_type_embeddings.weight", (cfg.type_vocab_size, d)),
        tensors.norm(p + "LayerNorm", d), layers, cfg,
    )


def load_encoder_head(tensors: EncoderTensors, cfg: EncoderConfig, num_labels: int) -> EncoderHead:
    """A sequence classifier's head: BERT's pooler and `classifier`, or RoBERTa's `classifier.dense` and
    `classifier.out_proj`."""
    d = cfg.hidden_size
    if cfg.head == "bert":
        return EncoderHead(tensors.dense(f"{tensors.prefix}pooler.dense", d, d),
                           tensors.dense("classifier", d, num_labels))
    return EncoderHead(tensors.dense("classifier.dense", d, d), tensors.dense("classifier.out_proj", d, num_labels))


def head_rows(tensors: EncoderTensors, cfg: EncoderConfig) -> int:
    """How many labels the stored head scores (its output layer's rows)."""
    name = "classifier.bias" if cfg.head == "bert" else "classifier.out_proj.bias"
    if name not in tensors.index:
        raise CheckpointError(f"checkpoint {tensors.model_dir} has no {name}; a {cfg.architecture} checkpoint "
                              "stores its classifier head under that name")
    with open_safetensors(tensors.index[name]) as st:
        return int(st.get_slice(name).get_shape()[0])
