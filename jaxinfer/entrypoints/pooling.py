"""`LLM(runner=...)` as vLLM's: a model started to generate, or to pool its final hidden states into
embeddings (`runner="pooling"`: `LLM.embed`, the server's /v1/embeddings), or into a classifier's scores
(`LLM.classify`, `LLM.score`, /classify, /v1/score, /rerank: entrypoints/scoring).

"auto" pools for a model saved without an output head (`models/base_models`: a base model such as
`Qwen3Model`, `MistralModel`, a `*ForSequenceClassification` one, or an encoder: BERT, RoBERTa, XLM-R,
entrypoints/encoder_loading) and generates otherwise, so a
`*ForCausalLM` embedding checkpoint (Qwen3-Embedding) is started with runner="pooling", as in vLLM. A
pooling model reads no output head, keeps a KV pool of one sequence (the engine wants one; pooling never
uses it) and refuses generation by name.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from jaxinfer.config import validation
from jaxinfer.config.engine import EngineConfig
from jaxinfer.config.model import ConfigError, read_config_json
from jaxinfer.config.pooler import Pooler, check_pooling
from jaxinfer.engine.outputs import EmbeddingOutput, EmbeddingRequestOutput, PoolingOutput, PoolingRequestOutput
from jaxinfer.models.base_models import pools_only
from jaxinfer.models.encoder_config import is_encoder

RUNNERS = ("auto", "generate", "pooling")


def resolve_runner(runner: Any, model_dir: Path) -> str:
    """"generate" or "pooling": `runner` itself, or for "auto" pooling for a model without an output head
    and generate otherwise."""
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
    archs = read_config_json(model_dir).get("architectures") or []
    headless = len(archs) == 1 and pools_only(archs[0])
    if runner == "auto":
        return "pooling" if headless else "generate"
    if runner == "generate" and headless and is_encoder(archs[0]):
        raise ConfigError(f"runner='generate' needs a decoder, and {model_dir / 'config.json'} names {archs[0]}, an "
                          "encoder (bidirectional: it embeds and scores, never generates); use runner='pooling' or "
                          "'auto'")
    if runner == "generate" and headless:
        raise ConfigError(f"runner='generate' needs an output head, and {model_dir / 'config.json'} names {archs[0]}, "
                          "a model saved without one; use runner='pooling' (embeddings, classify, score) or 'auto'")
    return runner


def check_pooling_knobs(speculative: Any, enable_lora: bool) -> None:
    """Refuse, by name, the settings only generation uses."""
    if speculative is not None:
        raise ValueError("speculative decodes faster, and runner='pooling' does not decode (it computes "
                         "embeddings); leave speculative out or use runner='generate'")
    if enable_lora:
        raise ValueError("enable_lora=True serves LoRA adapters for generation; runner='pooling' embeds with the "
                         "base model only: leave enable_lora out")


def pooling_engine_config(config: EngineConfig) -> EngineConfig:
    """The engine of a pooling model: a KV pool of one sequence unless num_pages says otherwise (embeddings
    never use it; the engine wants one)."""
    return config if config.num_pages is not None else dataclasses.replace(config, num_pages=config.pages_per_seq + 1)


def not_generating(what: str) -> ValueError:
    """The error of a generation call on a pooling model."""
    return ValueError(f"{what} generates, and this LLM was started with runner='pooling' to compute embeddings "
                      "(LLM.embed) or scores (LLM.classify, LLM.score); start another with runner='generate' "
                      "(a *ForCausalLM checkpoint) to generate")


def embed_settings(pooler: Pooler, pooling: Any, normalize: Any, dimensions: Any) -> tuple[str, bool, int | None]:
    """An embed call's (pooling, normalize, dimensions), None taking the model's; each checked by name."""
    pooling = pooler.pooling if pooling is None else check_pooling(pooling)
    normalize = pooler.normalize if normalize is None else validation.boolean(normalize, "normalize")
    return pooling, normalize, pooler.check_dimensions(dimensions)


def pooling_outputs(rows: np.ndarray, all_ids: list[list[int]]) -> list[PoolingRequestOutput]:
    """vLLM's outputs of `LLM.encode`, one float32 vector per prompt in order."""
    return [PoolingRequestOutput(str(i), PoolingOutput(np.asarray(row, np.float32)), ids)
            for i, (row, ids) in enumerate(zip(rows, all_ids))]


def embedding_outputs(vectors: np.ndarray, all_ids: list[list[int]]) -> list[EmbeddingRequestOutput]:
    """vLLM's outputs of `LLM.embed`, one per prompt in order."""
    return [EmbeddingRequestOutput(str(i), EmbeddingOutput(vector.tolist()), ids)
            for i, (vector, ids) in enumerate(zip(vectors, all_ids))]
