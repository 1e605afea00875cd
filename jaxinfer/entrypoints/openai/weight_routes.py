"""Sleep mode and weight updates over HTTP, for RL frameworks driving a server between rollouts.

vLLM's sleep routes (`--enable-sleep-mode`): POST /sleep?level=1|2, POST /wake_up, GET /is_sleeping;
SGLang's update route (`--enable-weight-updates`): POST /update_weights_from_disk {"model_path"}.
Each runs `LLM.sleep` / `wake_up` / `update_weights_from_disk` in the engine's step thread between
steps; with requests in flight they answer 409 (let them finish), and requests sent while asleep
get 503 saying what wakes the server.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from jaxinfer.engine import AsyncLLMEngine
from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.protocol import StrictBody


class UpdateWeightsFromDiskRequest(StrictBody):
    model_path: str
    load_format: str | None = None  # SGLang's field: the checkpoint's own format is read whatever it says


async def _between_steps(engine: AsyncLLMEngine, function: Callable[[], Any], param: str | None = None) -> Any:
    """function() in the step thread; 409 when requests are in flight, 400 naming `param` for bad input."""
    try:
        return await engine.call(function)
    except RuntimeError as error:
        raise APIError(str(error), 409) from None
    except ValueError as error:  # CheckpointError too: the directory and what is wrong with it
        raise APIError(str(error), param=param) from None


def add_sleep_routes(app: FastAPI, engine: AsyncLLMEngine, llm: Any) -> None:
    """POST /sleep, POST /wake_up, GET /is_sleeping over `llm` (a jaxinfer.LLM) and its AsyncLLMEngine."""

    @app.post("/sleep")
    async def sleep(level: int = 1) -> JSONResponse:
        await _between_steps(engine, lambda: llm.sleep(level), "level")
        return JSONResponse({})

    @app.post("/wake_up")
    async def wake_up() -> JSONResponse:
        await _between_steps(engine, llm.wake_up)
        return JSONResponse({})

    @app.get("/is_sleeping")
    async def is_sleeping() -> JSONResponse:
        return JSONResponse({"is_sleeping": llm.is_sleeping})


def add_update_routes(app: FastAPI, engine: AsyncLLMEngine, llm: Any) -> None:
    """POST /update_weights_from_disk over `llm` and its AsyncLLMEngine (SGLang's body and answer)."""

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: UpdateWeightsFromDiskRequest) -> JSONResponse:
        await _between_steps(engine, lambda: llm.update_weights_from_disk(body.model_path), "model_path")
        return JSONResponse({"success": True, "message": f"serving the weights of {body.model_path}"})
