"""POST /v1/embeddings (OpenAI's embeddings API, as vLLM serves it for decoder models): each input's
final hidden states pooled at its last token and L2-normalized (`LLM.embed`'s defaults), run in
the engine's step thread between steps."""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np

from jaxinfer.engine import AsyncLLMEngine
from jaxinfer.entrypoints.openai.completions import prompt_list
from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.formatting import usage
from jaxinfer.entrypoints.openai.protocol import StrictBody
from jaxinfer.entrypoints.openai.serving import ServerState


class EmbeddingRequest(StrictBody):
    """OpenAI's embeddings body."""

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


async def create_embeddings(body: EmbeddingRequest, state: ServerState, engine: AsyncLLMEngine) -> dict:
    """The response body: one embedding per input, in order, and the prompt tokens used."""
    if state.check_model(body.model) is not None:
        raise APIError("embeddings are served for the base model only, not through a LoRA adapter", param="model")
    if body.dimensions is not None:
        raise APIError("dimensions is not supported: embeddings keep the model's hidden size (no Matryoshka "
                       "truncation); leave it out", param="dimensions")
    try:
        inputs = prompt_list(body.input)
    except APIError as error:
        raise APIError(error.message.replace("prompt", "input", 1), param="input") from None
    bound = state.limits.max_prompts
    if len(inputs) > bound:
        raise APIError(f"input: {len(inputs)} inputs is over this server's limit of {bound} (--max-prompts); "
                       f"accepted: at most {bound}", param="input")
    all_ids = [state.encode(text, "input") for text in inputs]
    for ids in all_ids:
        try:
            state.check_length(ids, 0)
        except APIError as error:
            raise APIError(f"input: {error.message}", param="input") from None
    vectors = await engine.embed(all_ids)
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
            for i, v in enumerate(vectors)]
    name = body.model or state.model_name
    tokens = sum(len(ids) for ids in all_ids)
    return {"object": "list", "data": data, "model": name, "usage": usage(tokens, 0)}


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """float: a JSON list; base64: the little-endian float32 bytes, as OpenAI sends them."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
