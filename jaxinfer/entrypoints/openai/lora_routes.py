"""vLLM's runtime LoRA routes: POST /v1/load_lora_adapter and /v1/unload_lora_adapter.

Served only when asked for (`--allow-runtime-lora-updating`, or vLLM's environment variable
VLLM_ALLOW_RUNTIME_LORA_UPDATING=true): they read directories the client names. A loaded adapter
is read and checked before the answer (a bad one is a 400 naming its path), then served by name
like a --lora-modules one; an unloaded one is refused by name at once, while the requests
already running with it finish with it.
"""

from __future__ import annotations

import asyncio
import itertools

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from jaxinfer.config.lora import LoRARequest
from jaxinfer.engine import AsyncLLMEngine
from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.protocol import StrictBody
from jaxinfer.entrypoints.openai.serving import ServerState


class LoadLoRAAdapterRequest(StrictBody):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(StrictBody):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's field, accepted; adapters are told apart by name


def add_lora_routes(app: FastAPI, state: ServerState, engine: AsyncLLMEngine) -> None:
    """The two routes over `engine` (the served engine: adapter requests are never shadowed)."""
    updating = asyncio.Lock()  # one change at a time: a name is checked and taken in one piece
    ids = itertools.count(1 + max((a.lora_int_id for a in state.adapters.values()), default=0))

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        name = body.lora_name
        async with updating:
            if name == state.model_name or name in state.adapters:
                raise APIError(f"The lora adapter '{name}' has already been loaded"
                               + (" (it is the served model's name)." if name == state.model_name else "."),
                               param="lora_name")
            try:
                adapter = LoRARequest(name, next(ids), body.lora_path)
                await engine.add_lora(adapter)
            except ValueError as error:  # CheckpointError too: the directory and what is wrong
                raise APIError(f"lora_path {body.lora_path!r}: {error}", param="lora_path") from None
            state.adapters[name] = adapter
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        name = body.lora_name
        async with updating:
            if name not in state.adapters:
                raise APIError(f"The lora adapter '{name}' cannot be found.", 404, "lora_name", kind="NotFoundError")
            del state.adapters[name]  # refused by name from here on
            await engine.remove_lora(name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
