"""The `score` head of a `*ForSequenceClassification` checkpoint (HF's generic sequence classifier: a
bias-free Linear [num_labels, D] on the decoder's final hidden states), read beside the decoder, whose
tensors load as the causal LM's without a head. Labels come from config.json's id2label (HF's own
`LABEL_i` names where it has none); pad_token_id is what HF's classifier skips when it picks the last token."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import jax.numpy as jnp
from safetensors import safe_open

from jaxinfer.config.errors import CheckpointError
from jaxinfer.config.model import ConfigError
from jaxinfer.models.base_models import is_classifier
from jaxinfer.parallel.sharding import UNSHARDED, Layout

SCORE_HEAD = "score.weight"


@dataclasses.dataclass(frozen=True)
class Classifier:
    """A classifier's head on the device and what its outputs mean."""

    weight: Any  # [num_labels, D], replicated; an encoder's EncoderHead (models/encoder_heads)
    labels: tuple[str, ...]  # id2label, in label order
    pad_token_id: int | None  # HF picks the last token that is not it (None: the last token)
    token_types: bool = False  # pairs go with their token types in the ids (a BERT cross-encoder: models/encoder)

    @property
    def num_labels(self) -> int:
        return len(self.labels)


def decoder_index(hf: Mapping[str, Any], index: dict[str, Path]) -> dict[str, Path]:
    """A checkpoint's tensor index without a classifier's head (config.json `hf` names the architecture):
    the decoder's tensors, as its causal LM names them."""
    if not is_classifier(((hf.get("architectures") or [""])[0])):
        return index
    return {name: path for name, path in index.items() if name != SCORE_HEAD}


def labels_of(hf: Mapping[str, Any], stored_rows: int, path: Path) -> tuple[str, ...]:
    """The label names by id: config.json's id2label (keys 0..n-1), else HF's defaults for the head's rows."""
    id2label = hf.get("id2label")
    if not id2label:
        return tuple(f"LABEL_{i}" for i in range(stored_rows))
    if not isinstance(id2label, dict) or sorted(map(str, id2label)) != sorted(str(i) for i in range(len(id2label))):
        raise ConfigError(f"{path}: id2label must map the ids 0..num_labels-1 to names, got {id2label!r}")
    if len(id2label) != stored_rows:
        raise CheckpointError(f"{SCORE_HEAD} has {stored_rows} rows and {path} names {len(id2label)} labels in "
                              "id2label; expected one row per label")
    return tuple(str(id2label.get(i, id2label.get(str(i)))) for i in range(stored_rows))


def load_classifier(
    model_dir: Path, hf: Mapping[str, Any], index: Mapping[str, Path], hidden_size: int, dtype: Any,
    layout: Layout = UNSHARDED,
) -> Classifier:
    """The head of a classifier checkpoint (config.json `hf`, tensors `index`), in `dtype` on every device."""
    if SCORE_HEAD not in index:
        raise CheckpointError(f"checkpoint {model_dir} has no {SCORE_HEAD}; a {hf['architectures'][0]} checkpoint "
                              "stores its classifier head under that name")
    with safe_open(index[SCORE_HEAD], "numpy") as st:  # a file the decoder's loading has read already
        weight = st.get_slice(SCORE_HEAD)[:]
    if weight.ndim != 2 or weight.shape[1] != hidden_size:
        raise CheckpointError(f"tensor {SCORE_HEAD} in {index[SCORE_HEAD].name} has shape {tuple(weight.shape)}, "
                              f"expected (num_labels, {hidden_size})")
    labels = labels_of(hf, weight.shape[0], model_dir / "config.json")
    pad = hf.get("pad_token_id")
    return Classifier(layout.put(weight.astype(jnp.dtype(dtype))), labels, pad if isinstance(pad, int) else None)
