"""POST /classify, /v1/score (and /score), /rerank (and /v1/rerank, /v2/rerank) as vLLM serves them, for a
model started with `--runner pooling`: a `*ForSequenceClassification` checkpoint classifies (/classify) and,
with one label, scores pairs as a cross-encoder; an embedding model scores pairs by cosine similarity. What
is computed is `LLM.classify` / `LLM.score`'s (entrypoints/scoring), in passes run in the engine's step
thread between steps. /rerank is Jina's and Cohere's API: one query against documents, results sorted by
relevance_score, the best top_n (0 or none: all). A generation model's server answers each with a 400."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import numpy as np
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from jaxinfer.checkpoint.score_head import Classifier
from jaxinfer.config.pooler import Pooler
from jaxinfer.engine import AsyncLLMEngine
from jaxinfer.entrypoints import scoring
from jaxinfer.entrypoints.openai.embeddings import input_ids
from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.formatting import usage
from jaxinfer.entrypoints.openai.protocol import StrictBody
from jaxinfer.entrypoints.openai.serving import ServerState, new_id


class ClassificationRequest(StrictBody):
    """vLLM's /classify body."""

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    user: str | None = None


class ScoreRequest(StrictBody):
    """vLLM's /v1/score body: pairs 1:1, 1:N or N:N."""

    text_1: str | list[str]
    text_2: str | list[str]
    model: str | None = None
    user: str | None = None


class RerankRequest(StrictBody):
    """Jina's and Cohere's rerank body, as vLLM's /rerank takes it (return_documents: Cohere's)."""

    query: str
    documents: list[str]
    top_n: int | None = None
    return_documents: bool = True
    model: str | None = None
    user: str | None = None


@dataclasses.dataclass(frozen=True)
class Scorer:
    """What a pooling server classifies and scores with: its classifier (None: an embedding model)."""

    state: ServerState
    engine: AsyncLLMEngine
    pooler: Pooler
    classifier: Classifier | None

    def check(self, body_model: str | None, route: str) -> None:
        """400 for an adapter's name (pooling runs the base model only)."""
        if self.state.check_model(body_model) is not None:
            raise APIError(f"{route} is served for the base model only, not through a LoRA adapter", param="model")

    async def probabilities(self, all_ids: list[list[int]]) -> np.ndarray:
        """The classifier's probabilities [N, num_labels] of prompts (LLM.classify's)."""
        pad = self.classifier.pad_token_id if self.pooler.pooling == "last" else None
        ids = [scoring.classified_ids(x, pad) for x in all_ids]
        return scoring.probabilities(await self.engine.embed(ids, self.pooler.pooling, self.classifier.weight))

    async def pair_scores(self, pairs: list[tuple[str, str]], names: tuple[str, str]) -> tuple[np.ndarray, int]:
        """(each pair's score, the tokens read) as LLM.score computes them; length errors name the field."""
        try:
            scoring.check_cross_encoder(self.classifier, "this route")
        except ValueError as error:
            raise APIError(str(error), param="model") from None
        if self.classifier is not None:
            encodings = await asyncio.to_thread(scoring.pair_encodings, self._tokenizer(), pairs)
            all_ids = [ids for ids, _ in encodings]
            self._check_lengths(all_ids, names[1])
            passed = scoring.passed_ids(encodings, self.classifier.token_types)
            return (await self.probabilities(passed))[:, 0], sum(map(len, all_ids))
        texts = scoring.pair_texts(pairs)
        all_ids = await asyncio.to_thread(lambda: [self.state.encode(text, names[1]) for text in texts])
        self._check_lengths(all_ids, names[1])
        vectors = await self.engine.embed(all_ids, self.pooler.pooling)
        lengths = dict(zip(texts, map(len, all_ids)))
        return scoring.cosine_pair_scores(pairs, texts, vectors), sum(lengths[a] + lengths[b] for a, b in pairs)

    def _tokenizer(self):
        if self.state.tokenizer is None:
            raise APIError("this model has no tokenizer, and pairs are read as the tokenizer's pair encoding",
                           param="model")
        return self.state.tokenizer

    def _check_lengths(self, all_ids: list[list[int]], field: str) -> None:
        for i, ids in enumerate(all_ids):
            try:
                self.state.check_length(ids, 0)
            except APIError as error:
                raise APIError(f"{field}[{i}]: {error.message}", param=field) from None


def pooling_route_refused(route: str, model_name: str) -> APIError:
    """The 400 of a pooling route on a server started to generate."""
    return APIError(f"{route} is served by pooling models (a *ForSequenceClassification checkpoint, or an embedding "
                    f"model for scores), and `{model_name}` was started to generate; start one with `jaxinfer serve "
                    "--model DIR --runner pooling` (LLM(..., runner='pooling'))", param="model")


async def create_classification(body: ClassificationRequest, scorer: Scorer) -> dict:
    """vLLM's /classify response: each input's label (the likeliest) and probabilities, in order."""
    scorer.check(body.model, "/classify")
    if scorer.classifier is None:
        raise APIError(f"/classify is served by classifiers (a *ForSequenceClassification checkpoint), and "
                       f"`{scorer.state.model_name}` is an embedding model: POST /v1/embeddings or /v1/score",
                       param="model")
    all_ids = await asyncio.to_thread(input_ids, body.input, scorer.state)
    probs = await scorer.probabilities(all_ids)
    labels = scorer.classifier.labels
    data = [{"index": i, "label": labels[int(np.argmax(p))], "probs": p.tolist(), "num_classes": len(p)}
            for i, p in enumerate(probs)]
    return {"id": new_id("classify"), "object": "list", "created": int(time.time()),
            "model": body.model or scorer.state.model_name, "data": data,
            "usage": usage(sum(map(len, all_ids)), 0)}


async def create_score(body: ScoreRequest, scorer: Scorer) -> dict:
    """vLLM's /v1/score response: one score per pair, in order."""
    scorer.check(body.model, "/v1/score")
    pairs = _pairs(body.text_1, body.text_2, ("text_1", "text_2"), scorer.state)
    scores, tokens = await scorer.pair_scores(pairs, ("text_1", "text_2"))
    data = [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scores)]
    return {"id": new_id("score"), "object": "list", "created": int(time.time()),
            "model": body.model or scorer.state.model_name, "data": data, "usage": usage(tokens, 0)}


async def create_rerank(body: RerankRequest, scorer: Scorer) -> dict:
    """The rerank response: the best top_n documents by relevance_score, best first, with their indices."""
    scorer.check(body.model, "/rerank")
    if body.top_n is not None and body.top_n < 0:
        raise APIError(f"top_n must be >= 0 (0: every document), got {body.top_n}", param="top_n")
    pairs = _pairs(body.query, body.documents, ("query", "documents"), scorer.state)
    scores, tokens = await scorer.pair_scores(pairs, ("query", "documents"))
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: body.top_n or None]
    results = [{"index": i, "relevance_score": float(scores[i]),
                **({"document": {"text": body.documents[i]}} if body.return_documents else {})} for i in order]
    return {"id": new_id("rerank"), "model": body.model or scorer.state.model_name, "results": results,
            "usage": {"total_tokens": tokens}}


def _pairs(text_1: str | list[str], text_2: str | list[str], names: tuple[str, str],
           state: ServerState) -> list[tuple[str, str]]:
    """The request's pairs; a 400 naming the field when they do not pair or are over --max-prompts."""
    try:
        pairs = scoring.score_pairs(text_1, text_2, names)
    except ValueError as error:
        raise APIError(str(error), param=names[1] if str(error).startswith(names[1]) else names[0]) from None
    bound = state.limits.max_prompts
    if len(pairs) > bound:
        raise APIError(f"{names[1]}: {len(pairs)} pairs is over this server's limit of {bound} (--max-prompts); "
                       f"accepted: at most {bound}", param=names[1])
    return pairs


def add_scoring_routes(app: FastAPI, state: ServerState, engine: AsyncLLMEngine, llm: Any) -> None:
    """/classify, /v1/score and /score, /rerank, /v1/rerank and /v2/rerank over `llm` (a jaxinfer.LLM) started
    with runner='pooling'; for any other, each route is a 400 saying how to start one."""
    pooling = getattr(llm, "runner_type", "") == "pooling"
    scorer = Scorer(state, engine, llm.pooler, getattr(llm, "classifier", None)) if pooling else None

    def served(route: str) -> Scorer:
        if scorer is None:
            raise pooling_route_refused(route, state.model_name)
        return scorer

    @app.post("/classify")
    async def classify(body: ClassificationRequest) -> JSONResponse:
        return JSONResponse(await create_classification(body, served("/classify")))

    async def score(body: ScoreRequest) -> JSONResponse:
        return JSONResponse(await create_score(body, served("/v1/score")))

    async def rerank(body: RerankRequest) -> JSONResponse:
        return JSONResponse(await create_rerank(body, served("/rerank")))

    for path in ("/v1/score", "/score"):
        app.post(path)(score)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.post(path)(rerank)
