"""`LLM`'s pooling calls (vLLM's `encode`, `embed`, `classify`, `score`): one vector or score per prompt, from
the final hidden states pooled beside the engine's steps (runtime/embeddings), not from generated tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from jaxinfer.config.pooling_params import PoolingParams, check_task
from jaxinfer.engine.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    ScoringRequestOutput,
)
from jaxinfer.entrypoints.call_arguments import Prompt, progress_bar
from jaxinfer.entrypoints.pooling import embed_settings, embedding_outputs, pooling_outputs
from jaxinfer.entrypoints.scoring import (
    check_cross_encoder,
    classification_outputs,
    classified_ids,
    cosine_pair_scores,
    pair_encodings,
    pair_texts,
    passed_ids,
    probabilities,
    score_pairs,
    scoring_outputs,
)
from jaxinfer.runtime.embeddings import finish_embeddings

if TYPE_CHECKING:
    from jaxinfer.entrypoints.llm import LLM


class PoolingCalls:
    """The pooling calls of `LLM` (mixed into it: `self` is the LLM)."""

    def encode(
        self: LLM, prompts: Prompt | Sequence[Prompt], pooling_params: PoolingParams | None = None, *,
        use_tqdm: bool = False, pooling_task: str | None = None,
    ) -> list[PoolingRequestOutput]:
        """Each prompt's pooled vector, in order (vLLM's `LLM.encode`, whose pooling_task is required too):
        "embed" as `embed` gives it, "classify" a classifier's probabilities (its logits with
        `PoolingParams(use_activation=False)`). Token ids of a prompt: `tokenize`."""
        task = check_task(pooling_task)
        if self.runner_type != "pooling":
            raise ValueError(f"LLM.encode pools hidden states (vLLM's), and this LLM was started with "
                             f"runner={self.runner_type!r} to generate; start it with runner='pooling', or take "
                             "a prompt's token ids with llm.tokenize(prompt)")
        params = PoolingParams() if pooling_params is None else pooling_params
        if not isinstance(params, PoolingParams):
            raise ValueError(f"pooling_params must be a PoolingParams or None, got {type(params).__name__}")
        if task == "embed":
            return pooling_outputs(*self._embedded(prompts, None, params.normalize, params.dimensions, use_tqdm))
        if self.classifier is None:
            raise ValueError(f"pooling_task 'classify' needs a *ForSequenceClassification checkpoint; "
                             f"{self.model_dir} has no classifier head (pooling_task 'embed' pools it)")
        all_ids = self._checked_ids(prompts, 0)
        logits = self._classifier_logits(all_ids, use_tqdm)
        return pooling_outputs(logits if params.use_activation is False else probabilities(logits), all_ids)

    def embed(
        self: LLM, prompts: Prompt | Sequence[Prompt], pooling: str | None = None, normalize: bool | None = None,
        dimensions: int | None = None, use_tqdm: bool = False,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt, in order (vLLM's `LLM.embed`): the final hidden states pooled, "last"
        (the last token's, as decoder embedding models such as Qwen3-Embedding read them), "mean" or "cls"
        (the first token's), unit length when `normalize`; None takes the model's (`self.pooler`:
        pooler_config, a sentence-transformers directory's modules, else "last" and normalized).
        dimensions: a Matryoshka model's vectors cut to that length, then normalized (vLLM's `dimensions`).
        Prompts run in padded batches beside the engine's steps (runtime/embeddings)."""
        return embedding_outputs(*self._embedded(prompts, pooling, normalize, dimensions, use_tqdm))

    def _embedded(
        self: LLM, prompts: Prompt | Sequence[Prompt], pooling: str | None, normalize: bool | None,
        dimensions: int | None, use_tqdm: bool,
    ) -> tuple[np.ndarray, list[list[int]]]:
        """`embed`'s vectors [prompts, D] and each prompt's ids."""
        pooling, normalize, dimensions = embed_settings(self.pooler, pooling, normalize, dimensions)
        all_ids = self._checked_ids(prompts, 0)
        with progress_bar(use_tqdm, len(all_ids), "Embedded prompts", "req") as bar:
            vectors = self.engine.runner.embed(all_ids, pooling, bar.update)
        return finish_embeddings(vectors, dimensions, normalize), all_ids

    def classify(self: LLM, prompts: Prompt | Sequence[Prompt], use_tqdm: bool = False) -> list[ClassificationRequestOutput]:
        """Each prompt's probability of each label, in order (vLLM's `LLM.classify`): a
        `*ForSequenceClassification` model's head on its last token's state, as HF picks that token
        (entrypoints/scoring; an encoder's head reads the first token's: models/encoder_heads), then a softmax
        over the labels (a sigmoid for one); `classifier.labels` names them."""
        if self.classifier is None:
            raise ValueError("LLM.classify needs a *ForSequenceClassification checkpoint (a decoder with a `score` "
                             f"head) started with runner='pooling' or 'auto'; {self.model_dir} was started "
                             f"with runner={self.runner_type!r} and has no classifier head")
        all_ids = self._checked_ids(prompts, 0)
        return classification_outputs(probabilities(self._classifier_logits(all_ids, use_tqdm)), all_ids)

    def score(self: LLM, text_1: str | Sequence[str], text_2: str | Sequence[str], use_tqdm: bool = False,
              ) -> list[ScoringRequestOutput]:
        """One score per pair (vLLM's `LLM.score`), pairs 1:1, 1:N (text_1 with each text_2) or N:N: a
        cross-encoder's (a classifier of one label) sigmoid of its logit on the tokenizer's pair encoding, or
        an embedding model's cosine similarity of the two texts' embeddings (entrypoints/scoring)."""
        if self.runner_type != "pooling":
            raise ValueError(
                "LLM.score scores with a cross-encoder or an embedding model started with runner='pooling', and "
                "this LLM was started to generate; start the model with runner='pooling'")
        check_cross_encoder(self.classifier, "LLM.score")
        pairs = score_pairs(text_1, text_2)
        if self.classifier is not None:
            encodings = pair_encodings(self.get_tokenizer(), pairs)
            all_ids = self._checked_ids([ids for ids, _ in encodings], 0)
            logits = self._classifier_logits(passed_ids(encodings, self.classifier.token_types), use_tqdm)
            return scoring_outputs(probabilities(logits)[:, 0], all_ids)
        texts = pair_texts(pairs)
        all_ids = self._checked_ids(texts, 0)
        with progress_bar(use_tqdm, len(texts), "Embedded texts", "req") as bar:
            vectors = self.engine.runner.embed(all_ids, self.pooler.pooling, bar.update)
        ids = dict(zip(texts, all_ids))
        return scoring_outputs(cosine_pair_scores(pairs, texts, vectors), [ids[a] + ids[b] for a, b in pairs])

    def _classifier_logits(self: LLM, all_ids: list[list[int]], use_tqdm: bool) -> np.ndarray:
        """Float32 [len(all_ids), num_labels]: the classifier's head on each prompt's pooled state."""
        pad = self.classifier.pad_token_id if self.pooler.pooling == "last" else None
        with progress_bar(use_tqdm, len(all_ids), "Classified prompts", "req") as bar:
            return self.engine.runner.embed([classified_ids(ids, pad) for ids in all_ids], self.pooler.pooling,
                                            bar.update, self.classifier.weight)
