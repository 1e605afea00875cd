"""Classification and scoring as vLLM's pooling runner does them (`LLM.classify`, `LLM.score`, the server's
/classify, /v1/score, /rerank), host side: the ids a classifier runs on, its logits' activation, pairing
texts, and the outputs. The model's pass (and a classifier's head on its pooled state) runs on the device
in `runtime/embeddings`.

A classifier reads the last token's state as HF's `*ForSequenceClassification` picks it: the last token
that is not config.json's pad_token_id (the first token when every one is). Causal attention makes
that the state of the prompt cut after that token, so trailing pad tokens are dropped before the pass.
Classify's probabilities are a softmax over the labels, a sigmoid for one label (vLLM's defaults).

Score: a cross-encoder (a classifier of one label) reads each pair as its tokenizer's pair encoding
(`tokenizer(text_1, text_pair=text_2)`, as vLLM and sentence-transformers' CrossEncoder build it; no
prompt template is applied; a BERT cross-encoder reads the encoding's token types too) and scores it by
the sigmoid of its logit; an embedding model scores a pair
by the cosine similarity of the two texts' embeddings. Pairs go 1:1, 1:N (text_1 against each text_2)
or N:N (in order), as vLLM pairs them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from jaxinfer.checkpoint.loader import safetensors_index
from jaxinfer.checkpoint.score_head import Classifier, load_classifier
from jaxinfer.config.model import read_config_json
from jaxinfer.engine.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from jaxinfer.models.base_models import is_classifier
from jaxinfer.models.encoder import TYPE_SHIFT
from jaxinfer.parallel.sharding import UNSHARDED, Layout


def classifier_for(model_dir: Path, hidden_size: int, dtype: Any, layout: Layout = UNSHARDED) -> Classifier | None:
    """The head of a `*ForSequenceClassification` checkpoint; None for any other model."""
    hf = read_config_json(model_dir)
    if not is_classifier((hf.get("architectures") or [""])[0]):
        return None
    return load_classifier(model_dir, hf, safetensors_index(model_dir), hidden_size, dtype, layout)


def classified_ids(ids: list[int], pad_token_id: int | None) -> list[int]:
    """The prompt up to the token HF's classifier reads: its last non-pad one (the first when all are pad)."""
    if pad_token_id is None:
        return ids
    last = max((i for i, token in enumerate(ids) if token != pad_token_id), default=0)
    return ids[: last + 1]


def probabilities(logits: np.ndarray) -> np.ndarray:
    """vLLM's classify activation of logits [N, num_labels]: softmax over the labels, a sigmoid for one."""
    logits = np.asarray(logits, np.float64)
    if logits.shape[-1] == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def text_list(value: Any, field: str) -> list[str]:
    """A text or a non-empty list of texts as a list; a ValueError naming the field otherwise."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{field} must be a string or a non-empty list of strings, got {value!r:.80}")
    return list(texts)


def score_pairs(text_1: Any, text_2: Any, names: tuple[str, str] = ("text_1", "text_2")) -> list[tuple[str, str]]:
    """The (text_1, text_2) pairs to score: 1:1, 1:N (the one text_1 with each text_2) or N:N (in order)."""
    firsts, seconds = text_list(text_1, names[0]), text_list(text_2, names[1])
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    if len(firsts) != len(seconds):
        raise ValueError(f"{names[0]} has {len(firsts)} texts and {names[1]} {len(seconds)}; pairs go 1:1, 1:N "
                         f"(one {names[0]}) or N:N (as many of each)")
    return list(zip(firsts, seconds))


def pair_encodings(tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """Each pair's (ids, token types) as the tokenizer's pair encoding (its special tokens around and between
    the two texts): types 1 on the second text's tokens where the tokenizer gives them (BERT's), else 0."""
    out = []
    for first, second in pairs:
        encoding = tokenizer(first, text_pair=second)
        ids = list(encoding["input_ids"])
        out.append((ids, list(encoding.get("token_type_ids") or [0] * len(ids))))
    return out


def passed_ids(encodings: Sequence[tuple[list[int], list[int]]], token_types: bool) -> list[list[int]]:
    """The ids a classifier's pass reads: with `token_types` (a BERT cross-encoder, Classifier.token_types) each
    type-1 token marked in bit TYPE_SHIFT (models/encoder), else the ids as they are."""
    if not token_types:
        return [ids for ids, _ in encodings]
    return [[token | (kind << TYPE_SHIFT) for token, kind in zip(ids, types)] for ids, types in encodings]


def check_cross_encoder(classifier: Classifier | None, what: str) -> None:
    """Refuse scoring pairs with a classifier of more than one label (which of its labels is the score?)."""
    if classifier is not None and classifier.num_labels != 1:
        raise ValueError(f"{what} scores pairs with a cross-encoder (a classifier of one label), and this model "
                         f"classifies into {classifier.num_labels} labels {list(classifier.labels)[:5]}; use "
                         "classify for its probabilities")


def cosine_scores(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two [N, D] arrays of embeddings (vLLM's score for embedding models)."""
    norms = np.maximum(np.linalg.norm(first, axis=-1) * np.linalg.norm(second, axis=-1), 1e-12)
    return np.sum(np.asarray(first, np.float64) * second, axis=-1) / norms


def pair_texts(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """The pairs' texts, each once, in order of first use: what an embedding model embeds to score them."""
    return list(dict.fromkeys(text for pair in pairs for text in pair))


def cosine_pair_scores(pairs: Sequence[tuple[str, str]], texts: list[str], vectors: np.ndarray) -> np.ndarray:
    """Each pair's cosine similarity, vectors [len(texts), D] being the embeddings of `pair_texts(pairs)`."""
    row = {text: i for i, text in enumerate(texts)}
    return cosine_scores(vectors[[row[a] for a, _ in pairs]], vectors[[row[b] for _, b in pairs]])


def classification_outputs(probs: np.ndarray, all_ids: list[list[int]]) -> list[ClassificationRequestOutput]:
    """vLLM's outputs of `LLM.classify`, one per prompt in order."""
    return [ClassificationRequestOutput(str(i), ClassificationOutput(p.tolist()), ids)
            for i, (p, ids) in enumerate(zip(probs, all_ids))]


def scoring_outputs(scores: np.ndarray, all_ids: list[list[int]]) -> list[ScoringRequestOutput]:
    """vLLM's outputs of `LLM.score`, one per pair in order."""
    return [ScoringRequestOutput(str(i), ScoringOutput(float(score)), ids)
            for i, (score, ids) in enumerate(zip(scores, all_ids))]
