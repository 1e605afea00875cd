"""POST /v1/embeddings (OpenAI's embeddings API, as vLLM serves it): served by a model started for
embeddings (`jaxinfer serve --runner pooling`, `LLM(runner="pooling")`), each input's final hidden
states pooled and normalized as the model's pooler says (`LLM.embed`), `dimensions` for Matryoshka
models, in padded batches run in the engine's step thread between steps. A generation model's
server answers it with a 400 saying how to start an embedding one."""

from __future__ import annotations

import asyncio
import base64
from typing import Literal

import numpy as np

from jaxinfer.config.pooler import Pooler
from jaxinfer.engine import AsyncLLMEngine
from jaxinfer.entrypoints.openai.completions import prompt_list
from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.formatting import usage
from jaxinfer.entrypoints.openai.protocol import StrictBody
from jaxinfer.entrypoints.openai.serving import ServerState
from jaxinfer.runtime.embeddings import finish_embeddings


class EmbeddingRequest(StrictBody):
    """OpenAI's embeddings body."""

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


async def create_embeddings(
    body: EmbeddingRequest, state: ServerState, engine: AsyncLLMEngine, pooler: Pooler | None
) -> dict:
    """The response body: one embedding per input, in order, and the prompt tokens used. pooler: the
    served model's (None: a generation model, which serves no embeddings)."""
    if pooler is None:
        raise APIError(f"/v1/embeddings is served by embedding models, and `{state.model_name}` was started to "
                       "generate; start one with `jaxinfer serve --model DIR --runner pooling` (LLM(..., "
                       "runner='pooling'))", param="model")
    if state.check_model(body.model) is not None:
        raise APIError("embeddings are served for the base model only, not through a LoRA adapter", param="model")
    try:
        dimensions = pooler.check_dimensions(body.dimensions)
    except (TypeError, ValueError) as error:
        raise APIError(str(error), param="dimensions") from None
    all_ids = await asyncio.to_thread(input_ids, body.input, state)  # tokenized off the event loop
    vectors = finish_embeddings(await engine.embed(all_ids, pooler.pooling), dimensions, pooler.normalize)
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
            for i, v in enumerate(vectors)]
    tokens = sum(len(ids) for ids in all_ids)
    return {"object": "list", "data": data, "model": body.model or state.model_name, "usage": usage(tokens, 0)}


def input_ids(value: str | list, state: ServerState) -> list[list[int]]:
    """Each input's token ids (a request's `input`: a text, ids, or a list of either), checked: not empty, in
    the vocabulary, within --max-model-len and --max-prompts."""
    try:
        inputs = prompt_list(value)
    except APIError as error:
        raise APIError(error.message.replace("prompt", "input", 1), param="input") from None
    bound = state.limits.max_prompts
    if len(inputs) > bound:
        raise APIError(f"input: {len(inputs)} inputs is over this server's limit of {bound} (--max-prompts); "
                       f"accepted: at most {bound}", param="input")
    all_ids = [state.encode(text, "input") for text in inputs]
    for i, ids in enumerate(all_ids):
        try:
            state.check_length(ids, 0)
        except APIError as error:
            where = f"input[{i}]" if len(all_ids) > 1 else "input"
            raise APIError(f"{where}: {error.message}", param="input") from None
    return all_ids


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """float: a JSON list; base64: the little-endian float32 bytes, as OpenAI sends them."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
